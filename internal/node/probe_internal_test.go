package node

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestProbeTimeoutKeepsTheConnection: a probe that times out on a slow
// peer costs its stream, not the connection: the next probes ride the same
// HTTP/2 connection instead of queueing a new TCP connection each on a
// peer that is busy.
func TestProbeTimeoutKeepsTheConnection(t *testing.T) {
	var conns atomic.Int32
	release := make(chan struct{})
	var slow atomic.Bool
	slow.Store(true)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	defer close(release)

	tr := newProbeTransport(nil, func(string) {})
	defer tr.CloseIdleConnections()
	probe := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+probePath, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Errorf("probe answered over %s, want HTTP/2", resp.Proto)
		}
		return nil
	}
	for range 3 {
		if err := probe(50 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a probe of a stalled peer: %v, want a timeout", err)
		}
	}
	slow.Store(false)
	if err := probe(5 * time.Second); err != nil {
		t.Fatalf("a probe of the peer once it answers: %v", err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 4 probes, want 1", n)
	}
}

// TestProbeConnectionClosedByPeer: a probe connection that the peer closes
// (a relay that crashed closes them all) is told, with the peer's address,
// while one that this relay closes is not.
func TestProbeConnectionClosedByPeer(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	closed := make(chan string, 4)
	tr := newProbeTransport(nil, func(addr string) { closed <- addr })
	probe := func() {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+probePath, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	probe()
	srv.CloseClientConnections()
	select {
	case addr := <-closed:
		if addr != srv.Listener.Addr().String() {
			t.Errorf("told of %s closing, want %s", addr, srv.Listener.Addr())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not told that the peer closed the probe connection")
	}
	probe() // a new connection
	tr.CloseIdleConnections()
	select {
	case addr := <-closed:
		t.Errorf("told of %s closing, which this side closed", addr)
	case <-time.After(100 * time.Millisecond):
	}
}
