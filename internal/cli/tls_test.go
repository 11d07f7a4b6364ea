package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleettest"
	"github.com/switchboard-relay/switchboard/internal/node"
)

func TestServeFlagsTLS(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg node.Config
	var logf logFlags
	serveFlags(fs, &cfg, &logf)
	err := fs.Parse([]string{
		"--tls-cert", "/etc/switchboard/relay.pem", "--tls-key", "/etc/switchboard/relay.key",
		"--admin-tls-cert", "/etc/switchboard/admin.pem", "--admin-tls-key", "/etc/switchboard/admin.key",
		"--peer-ca-file", "/etc/switchboard/ca.pem",
	})
	if err != nil {
		t.Fatal(err)
	}
	got := [5]string{cfg.TLSCertFile, cfg.TLSKeyFile, cfg.AdminTLSCertFile, cfg.AdminTLSKeyFile, cfg.PeerCAFile}
	want := [5]string{"/etc/switchboard/relay.pem", "/etc/switchboard/relay.key", "/etc/switchboard/admin.pem", "/etc/switchboard/admin.key", "/etc/switchboard/ca.pem"}
	if got != want {
		t.Errorf("TLS fields = %q, want %q", got, want)
	}
}

func TestAgentFlagsCAFile(t *testing.T) {
	ca := fleettest.NewCA(t)
	_, keyFile := ca.Issue(t, "relay")
	parse := func(args ...string) (*agentFlags, error) {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f agentFlags
		f.register(fs)
		base := []string{"--relay", "https://127.0.0.1:8443", "--device", "dev", "--backend", "http://127.0.0.1:3000", "--token", "t"}
		return &f, fs.Parse(append(base, args...))
	}
	for _, name := range []string{"--ca-file", "--root-ca-file", "--root_ca_file"} {
		f, err := parse(name, ca.File)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := f.config()
		if err != nil || cfg.RootCAs == nil || !cfg.RootCAs.Equal(ca.Pool) {
			t.Errorf("%s: RootCAs %v, %v; want the CA file's pool", name, cfg.RootCAs, err)
		}
	}
	f, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := f.config(); err != nil || cfg.RootCAs != nil {
		t.Errorf("no --ca-file: RootCAs %v, %v; want nil (the system roots)", cfg.RootCAs, err)
	}
	f, err = parse("--ca-file", keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.config(); err == nil || !strings.Contains(err.Error(), "--ca-file") || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a key file as --ca-file: %v", err)
	}
}

func TestCtlCAFile(t *testing.T) {
	ca := fleettest.NewCA(t)
	certFile, keyFile := ca.Issue(t, "admin")
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != control.PathTokens || r.Header.Get("Authorization") != "Bearer sba_test" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "[]")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	tokenFile := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(tokenFile, []byte("sba_test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := runCtl(context.Background(), append([]string{"--admin", srv.URL, "--token-file", tokenFile}, args...), &out, &errOut)
		return out.String() + errOut.String(), err
	}

	if out, err := run("--ca-file", ca.File, "tokens", "list"); err != nil {
		t.Fatalf("ctl --ca-file against an https admin listener: %v\n%s", err, out)
	}
	if _, err := run("tokens", "list", "--ca-file", ca.File); err != nil {
		t.Fatalf("--ca-file after the command: %v", err)
	}
	_, err = run("tokens", "list")
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") || !strings.Contains(err.Error(), "pass --ca-file") {
		t.Errorf("ctl without --ca-file: %v; want the certificate error and the flag to fix it", err)
	}
	_, err = run("--ca-file", keyFile, "tokens", "list")
	if err == nil || !strings.Contains(err.Error(), "--ca-file") || !strings.Contains(err.Error(), keyFile) {
		t.Errorf("a key file as --ca-file: %v", err)
	}
}
