package tlsconf

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/testkit"
	"github.com/switchboard-relay/switchboard/internal/tlsconf/tlstest"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestReloaderPicksUpReplacedFiles(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	r, _, _ := newReloader(t, ca, dir, "first", nil)
	r.every = 10 * time.Millisecond
	addr := serveTLS(t, Server(r))
	if name, err := servedName(addr, ca.Pool()); err != nil || name != "first" {
		t.Fatalf("before the change: %q, %v", name, err)
	}

	ca.WritePair(t, dir, "second")
	eventually(t, 5*time.Second, func() error {
		name, err := servedName(addr, ca.Pool())
		if err != nil {
			return err
		}
		if name != "second" {
			return fmt.Errorf("still served %q: %w", name, errNotYet)
		}
		return nil
	})
}

func TestReloaderLooksAtMostOncePerInterval(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	r, _, _ := newReloader(t, ca, dir, "first", nil)
	clock := &fakeClock{now: time.Now()}
	r.now = clock.Now
	r.checked = clock.Now()
	addr := serveTLS(t, Server(r))

	ca.WritePair(t, dir, "second")
	clock.Advance(CheckInterval - time.Millisecond)
	if name, err := servedName(addr, ca.Pool()); err != nil || name != "first" {
		t.Fatalf("within the interval: %q, %v; want the files left alone", name, err)
	}
	clock.Advance(time.Millisecond)
	if name, err := servedName(addr, ca.Pool()); err != nil || name != "second" {
		t.Fatalf("after the interval: %q, %v; want the new certificate", name, err)
	}
}

func TestReloaderKeepsCertificateOnBrokenReplacement(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	logs := &testkit.Buffer{}
	r, certFile, keyFile := newReloader(t, ca, dir, "first", slog.New(slog.NewTextHandler(logs, nil)))
	clock := &fakeClock{now: time.Now()}
	r.now = clock.Now
	addr := serveTLS(t, Server(r))
	// served checks the files once more and returns the name served.
	served := func() string {
		t.Helper()
		clock.Advance(CheckInterval)
		name, err := servedName(addr, ca.Pool())
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		return name
	}
	warnings := func() int { return strings.Count(logs.String(), "do not load") }

	// A certificate file that is not PEM.
	tlstest.WriteFile(t, certFile, []byte("not a certificate"))
	for range 3 {
		if name := served(); name != "first" {
			t.Fatalf("broken certificate file: served %q, want the previous one", name)
		}
	}
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings for one broken change, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), certFile) {
		t.Errorf("the warning does not name %s:\n%s", certFile, logs)
	}

	// Half of a new pair: the certificate is new, the key still the old one.
	newCert, newKey := ca.Issue(t, "second")
	tlstest.WriteFile(t, certFile, newCert)
	for range 3 {
		if name := served(); name != "first" {
			t.Fatalf("half-written pair: served %q, want the previous one", name)
		}
	}
	if n := warnings(); n != 2 {
		t.Fatalf("%d warnings after two broken changes, want 2:\n%s", n, logs)
	}

	// The key arrives: the pair is whole again.
	tlstest.WriteFile(t, keyFile, newKey)
	if name := served(); name != "second" {
		t.Fatalf("completed pair: served %q, want %q", name, "second")
	}
	if !strings.Contains(logs.String(), "TLS certificate reloaded") {
		t.Errorf("no reload logged:\n%s", logs)
	}

	// A file removed for a moment, then back with a new pair.
	if err := os.Remove(certFile); err != nil {
		t.Fatal(err)
	}
	if name := served(); name != "second" {
		t.Fatalf("missing certificate file: served %q, want the previous one", name)
	}
	ca.WritePair(t, dir, "third")
	if name := served(); name != "third" {
		t.Fatalf("restored files: served %q, want %q", name, "third")
	}
}

func TestNewReloaderErrorsNameTheFile(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := ca.WritePair(t, dir, "first")
	missing := filepath.Join(dir, "missing.pem")
	otherDir := t.TempDir()
	_, otherKey := ca.WritePair(t, otherDir, "other")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, cert, key string
		want            []string
	}{
		{"missing certificate", missing, keyFile, []string{"TLS certificate file", missing, "no such file"}},
		{"missing key", certFile, missing, []string{"TLS key file", missing, "no such file"}},
		{"certificate not PEM", garbage, keyFile, []string{garbage, keyFile}},
		{"key of another certificate", certFile, otherKey, []string{certFile, otherKey, "does not match"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewReloader(tc.cert, tc.key, nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestLoadCAPool(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	r, _, keyFile := newReloader(t, ca, dir, "relay", nil)
	pool, err := LoadCAPool(ca.WriteCert(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if name, err := servedName(serveTLS(t, Server(r)), pool); err != nil || name != "relay" {
		t.Fatalf("verified with the loaded pool: %q, %v", name, err)
	}

	if _, err := LoadCAPool(keyFile); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") || !strings.Contains(err.Error(), keyFile) {
		t.Errorf("a key file as CA file: %v", err)
	}
	missing := filepath.Join(dir, "missing.pem")
	if _, err := LoadCAPool(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing CA file: %v", err)
	}
}

func TestServerConfigNegotiates(t *testing.T) {
	ca := tlstest.NewCA(t)
	r, _, _ := newReloader(t, ca, t.TempDir(), "relay", nil)
	addr := serveTLS(t, Server(r))
	for _, tc := range []struct {
		offer []string
		want  string
	}{
		{[]string{ProtoH2, ProtoHTTP1}, ProtoH2},
		{[]string{ProtoHTTP1}, ProtoHTTP1}, // the native tunnel and websockets
	} {
		st, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", NextProtos: tc.offer})
		if err != nil || st.NegotiatedProtocol != tc.want {
			t.Errorf("offering %v: negotiated %q, %v; want %q", tc.offer, st.NegotiatedProtocol, err, tc.want)
		}
	}
	if _, err := handshake(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MaxVersion: tls.VersionTLS11}); err == nil {
		t.Error("a TLS 1.1 client was served")
	}
}

func TestClientConfig(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	caFile := ca.WriteCert(t, dir)
	r, _, _ := newReloader(t, ca, dir, "relay", nil)
	addr := serveTLS(t, Server(r))

	system, err := Client("")
	if err != nil || system.RootCAs != nil || system.MinVersion != tls.VersionTLS12 {
		t.Fatalf("Client(\"\"): %+v, %v; want the system roots and TLS 1.2", system, err)
	}
	system.ServerName = "127.0.0.1"
	if _, err := handshake(addr, system); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("the system roots accepted a private CA: %v", err)
	}
	private, err := Client(caFile)
	if err != nil {
		t.Fatal(err)
	}
	private.ServerName = "127.0.0.1"
	if _, err := handshake(addr, private); err != nil {
		t.Errorf("with the CA file: %v", err)
	}
	if _, err := Client(filepath.Join(dir, "missing.pem")); err == nil {
		t.Error("a missing CA file gave no error")
	}
}
