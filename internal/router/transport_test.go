package router

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// protoServer answers every request with the HTTP version it came on.
func protoServer(t *testing.T, tlsOn bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.Proto)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusting client's failed handshake
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	if tlsOn {
		srv.Config.Protocols.SetHTTP2(true)
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Config.Protocols.SetUnencryptedHTTP2(true)
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

// TestPeerTransports: ordinary forwards go over HTTP/2 — by ALPN to an
// https:// peer, verified against the peer CAs, with prior knowledge to an
// http:// one — and upgrades over HTTP/1.1.
func TestPeerTransports(t *testing.T) {
	secure, plain := protoServer(t, true), protoServer(t, false)
	roots := x509.NewCertPool()
	roots.AddCert(secure.Certificate())
	f := NewFleet(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	t.Cleanup(f.Close)
	for _, tc := range []struct {
		url     string
		upgrade bool
		want    string
	}{
		{secure.URL, false, "HTTP/2.0"},
		{secure.URL, true, "HTTP/1.1"},
		{plain.URL, false, "HTTP/2.0"},
		{plain.URL, true, "HTTP/1.1"},
	} {
		req, err := http.NewRequest(http.MethodGet, tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := f.transport(req.URL.Scheme, tc.upgrade).RoundTrip(req)
		if err != nil {
			t.Fatalf("%s (upgrade %v): %v", tc.url, tc.upgrade, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("%s (upgrade %v): the peer saw %s, want %s", tc.url, tc.upgrade, got, tc.want)
		}
	}

	// Without the peer's CA the handshake fails verification.
	untrusting := NewFleet(nil)
	t.Cleanup(untrusting.Close)
	req, err := http.NewRequest(http.MethodGet, secure.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := untrusting.transport("https", false).RoundTrip(req); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a peer signed by an unknown CA: %v, want a certificate error", err)
	}
}
