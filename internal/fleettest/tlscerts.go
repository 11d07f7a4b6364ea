package fleettest

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/tlsconf/tlstest"
)

// CA is a throwaway certificate authority made at test time, for relays
// that serve TLS and the agents, users and peers that verify them.
type CA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool // holds Cert alone
	File string         // Cert as a PEM file, for --ca-file and PeerCAFile
	ca   *tlstest.CA
	dir  string
}

// NewCA makes a CA whose files live in a directory of the test's.
func NewCA(t testing.TB) *CA {
	t.Helper()
	ca, dir := tlstest.NewCA(t), t.TempDir()
	return &CA{Cert: ca.Cert(), Pool: ca.Pool(), File: ca.WriteCert(t, dir), ca: ca, dir: dir}
}

// Issue writes a server certificate named name for 127.0.0.1 and
// localhost, signed by the CA, and its key, and returns their paths.
func (ca *CA) Issue(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	dir, err := os.MkdirTemp(ca.dir, "leaf")
	if err != nil {
		t.Fatal(err)
	}
	return ca.ca.WritePair(t, dir, name)
}

// RelayTLS is a relay option: public and admin listeners serve TLS with
// certificates of the CA, and other relays are verified against it.
func (ca *CA) RelayTLS(t testing.TB) func(*node.Config) {
	return func(c *node.Config) {
		c.TLSCertFile, c.TLSKeyFile = ca.Issue(t, "relay")
		c.AdminTLSCertFile, c.AdminTLSKeyFile = ca.Issue(t, "relay admin")
		c.PeerCAFile = ca.File
	}
}

// Client returns an HTTP client that trusts the CA, speaking HTTP/2 by
// ALPN when h2 is set and HTTP/1.1 only otherwise. Its idle connections
// are closed when the test ends.
func (ca *CA) Client(t testing.TB, h2 bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12},
		Protocols:       new(http.Protocols),
	}
	tr.Protocols.SetHTTP1(true)
	tr.Protocols.SetHTTP2(h2)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// StartTLSRelay starts a relay like StartRelay whose listeners serve TLS
// with certificates of ca; its URL and AdminURL are https://.
func StartTLSRelay(t testing.TB, ca *CA, opts ...func(*node.Config)) *Relay {
	t.Helper()
	return withHTTPS(StartRelay(t, append([]func(*node.Config){ca.RelayTLS(t)}, opts...)...))
}

// StartTLSFleet starts n relays like StartFleet whose listeners serve TLS
// with certificates of ca and which verify each other against it.
func StartTLSFleet(t testing.TB, n int, ca *CA, opts ...func(*node.Config)) []*Relay {
	t.Helper()
	relays := StartFleet(t, n, append([]func(*node.Config){ca.RelayTLS(t)}, opts...)...)
	for _, r := range relays {
		withHTTPS(r)
	}
	return relays
}

func withHTTPS(r *Relay) *Relay {
	r.URL = "https://" + r.Node.Addr()
	r.AdminURL = "https://" + r.Node.AdminAddr()
	return r
}
