// Package tlsconf owns Switchboard's TLS settings: the relay's server
// configurations (TLS 1.2 or later, HTTP/2 and HTTP/1.1 by ALPN) with a
// certificate that is reloaded when its files are replaced, and the client
// configurations that relays, agents and ctl use to verify a relay against
// a CA bundle or the system roots.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// MinVersion is the oldest TLS version Switchboard speaks, as server or client.
const MinVersion = tls.VersionTLS12

// ALPN protocol names.
const (
	ProtoH2    = "h2"
	ProtoHTTP1 = "http/1.1"
)

// Server returns a server configuration that presents the certificate
// certs serves: TLS 1.2 at least, HTTP/2 and HTTP/1.1 offered by ALPN
// (clients that need an HTTP/1.1 Upgrade, such as the native agent tunnel
// and websockets, offer only http/1.1 and get it).
func Server(certs *Reloader) *tls.Config {
	return &tls.Config{
		MinVersion:     MinVersion,
		NextProtos:     []string{ProtoH2, ProtoHTTP1},
		GetCertificate: certs.GetCertificate,
	}
}

// Client returns a client configuration that verifies servers against the
// PEM bundle caFile, or against the system roots when caFile is empty.
// Callers set NextProtos (http.Transport does it by itself).
func Client(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: MinVersion}
	if caFile == "" {
		return cfg, nil
	}
	pool, err := LoadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// LoadCAPool reads a PEM bundle of CA certificates into a new pool that
// holds those certificates only (not the system roots). A file without any
// certificate is an error, so that a wrong path or a key file given by
// mistake is caught at start rather than as failed handshakes.
func LoadCAPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate (want one or more \"-----BEGIN CERTIFICATE-----\" blocks)", path)
	}
	return pool, nil
}
