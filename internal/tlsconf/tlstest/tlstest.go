// Package tlstest is test support only: throwaway CAs and certificates for
// tests of TLS servers and clients, made at test time (ECDSA P-256, a day
// long), and PEM files for the flags and configurations that name them.
// It must not import tlsconf, whose own tests use it.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// CA is a throwaway certificate authority that signs server certificates.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte // cert as PEM
}

// NewCA makes a CA, failing the test if it cannot.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
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
	return &CA{cert: cert, key: key, pem: encode("CERTIFICATE", der)}
}

// Cert returns the CA's certificate.
func (ca *CA) Cert() *x509.Certificate { return ca.cert }

// PEM returns the CA's certificate as PEM, the content of a CA file.
func (ca *CA) PEM() []byte { return ca.pem }

// Pool returns a new pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Issue returns a server certificate named cn for 127.0.0.1 and localhost
// (and for cn itself when it is a DNS name with a dot), signed by the CA,
// and its key, both as PEM.
func (ca *CA) Issue(t testing.TB, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	if strings.Contains(cn, ".") {
		tmpl.DNSNames = append(tmpl.DNSNames, cn)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return encode("CERTIFICATE", der), encode("EC PRIVATE KEY", kder)
}

// WriteCert writes the CA's certificate to dir/ca.pem and returns its path.
func (ca *CA) WriteCert(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ca.pem")
	WriteFile(t, path, ca.pem)
	return path
}

// WritePair issues a certificate named cn as Issue does and writes it and
// its key to dir/cert.pem and dir/key.pem, replacing any pair there, and
// returns their paths.
func (ca *CA) WritePair(t testing.TB, dir, cn string) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := ca.Issue(t, cn)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	WriteFile(t, certFile, certPEM)
	WriteFile(t, keyFile, keyPEM)
	return certFile, keyFile
}

// WriteFile puts data at path, mode 0600, the way deployment tools replace
// certificates: written beside it, then renamed over it.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func encode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
