package node_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/fleettest"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// TestTLSConfigValidate: a certificate goes with its key, and a relay that
// serves TLS does not advertise plain http://.
func TestTLSConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*node.Config)
		want string // "" for a valid config
	}{
		{"public pair", func(c *node.Config) { c.TLSCertFile, c.TLSKeyFile = "c.pem", "k.pem" }, ""},
		{"admin pair", func(c *node.Config) { c.AdminTLSCertFile, c.AdminTLSKeyFile = "c.pem", "k.pem" }, ""},
		{"public cert alone", func(c *node.Config) { c.TLSCertFile = "c.pem" }, "node: TLSCertFile is set but TLSKeyFile is not"},
		{"public key alone", func(c *node.Config) { c.TLSKeyFile = "k.pem" }, "node: TLSKeyFile is set but TLSCertFile is not"},
		{"admin cert alone", func(c *node.Config) { c.AdminTLSCertFile = "c.pem" }, "node: AdminTLSCertFile is set but AdminTLSKeyFile is not"},
		{"admin key alone", func(c *node.Config) { c.AdminTLSKeyFile = "k.pem" }, "node: AdminTLSKeyFile is set but AdminTLSCertFile is not"},
		{"http advertise with TLS", func(c *node.Config) {
			c.TLSCertFile, c.TLSKeyFile, c.Advertise = "c.pem", "k.pem", "http://relay-1.example.com"
		}, "advertise an https:// URL"},
		{"https advertise without TLS", func(c *node.Config) { c.Advertise = "https://relay-1.example.com" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c node.Config
			tc.set(&c)
			c.Complete()
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid config refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestStartTLSFilesFail: a certificate, key or CA file that is missing or
// holds nothing usable stops Start with a message naming the file.
func TestStartTLSFilesFail(t *testing.T) {
	ca := fleettest.NewCA(t)
	cert, key := ca.Issue(t, "relay")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name string
		set  func(*node.Config)
		want []string
	}{
		{"missing public certificate", func(c *node.Config) { c.TLSCertFile, c.TLSKeyFile = missing, key }, []string{"public listener", missing}},
		{"missing admin key", func(c *node.Config) { c.AdminTLSCertFile, c.AdminTLSKeyFile = cert, missing }, []string{"admin listener", missing}},
		{"peer CA file without certificates", func(c *node.Config) { c.PeerCAFile = key }, []string{"--peer-ca-file", key, "no PEM certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := node.Config{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: t.TempDir()}
			tc.set(&c)
			n, err := node.Start(t.Context(), c)
			if err == nil {
				n.Close()
				t.Fatal("Start succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Start: %v; does not say %q", err, w)
				}
			}
		})
	}
}
