package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/testkit"
	"github.com/switchboard-relay/switchboard/internal/tlsconf/tlstest"
)

// serveTLS accepts TLS connections with cfg on a loopback port until the
// test ends, completing each handshake and closing the connection.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				conn.(*tls.Conn).Handshake()
			})
		}
	})
	return ln.Addr().String()
}

// newReloader has ca write a certificate named cn and its key into dir,
// replacing any pair there, and returns a Reloader of them that logs to log
// (nil: nowhere), and their paths.
func newReloader(t *testing.T, ca *tlstest.CA, dir, cn string, log *slog.Logger) (r *Reloader, certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = ca.WritePair(t, dir, cn)
	r, err := NewReloader(certFile, keyFile, log)
	if err != nil {
		t.Fatal(err)
	}
	return r, certFile, keyFile
}

// handshake connects to addr with cfg and returns the negotiated state.
func handshake(addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState(), nil
}

// servedName returns the common name of the certificate addr presents.
func servedName(addr string, roots *x509.CertPool) (string, error) {
	st, err := handshake(addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		return "", err
	}
	return st.PeerCertificates[0].Subject.CommonName, nil
}

// eventually polls check until it returns nil or the deadline passes.
var eventually = testkit.Eventually

var errNotYet = errors.New("not yet")
