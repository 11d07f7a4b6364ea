package fleettest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/node"
)

// CA is a throwaway certificate authority made at test time, for relays
// that serve TLS and the agents, users and peers that verify them.
type CA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool // holds Cert alone
	File string         // Cert as a PEM file, for --ca-file and PeerCAFile
	key  *ecdsa.PrivateKey
	dir  string
}

// NewCA makes a CA whose files live in a directory of the test's.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "Switchboard test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, Pool: x509.NewCertPool(), key: key, dir: t.TempDir()}
	ca.Pool.AddCert(cert)
	ca.File = writePEM(t, filepath.Join(ca.dir, "ca.pem"), "CERTIFICATE", der)
	return ca
}

// Issue writes a server certificate named name for 127.0.0.1 and
// localhost, signed by the CA, and its key, and returns their paths.
func (ca *CA) Issue(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(ca.dir, "leaf")
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, filepath.Join(dir, "cert.pem"), "CERTIFICATE", der),
		writePEM(t, filepath.Join(dir, "key.pem"), "EC PRIVATE KEY", kder)
}

// writePEM writes der as one PEM block of type typ to path.
func writePEM(t testing.TB, path, typ string, der []byte) string {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
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
