package relay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/h1"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/splice"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// echoUpgrades is a backend that switches to the protocol asked for (or
// to the one its X-Answer header names) and echoes what it reads; its
// handler returns once the connection is handed to the echo.
func echoUpgrades(t *testing.T) string {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex // guards closed
		closed bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto := r.Header.Get("Upgrade")
		if a := r.Header.Get("X-Answer"); a != "" {
			proto = a
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", proto)
		brw.Flush()
		mu.Lock()
		defer mu.Unlock()
		if closed {
			c.Close()
			return
		}
		wg.Go(func() {
			mux.Copy(c, c)
			c.Close()
		})
	}))
	t.Cleanup(func() {
		srv.Close()
		mu.Lock()
		closed = true
		mu.Unlock()
		wg.Wait()
	})
	return srv.Listener.Addr().String()
}

// upgradeRelay serves a relay handler whose transport takes every device
// to backend over tunnel streams, as a version 2 agent's session carries
// them (the agent's side splices each stream onto a connection to
// backend), and reports each return of its handler on returned.
func upgradeRelay(t *testing.T, backend string, cfg Config) (*Handler, string, <-chan struct{}) {
	c, s := tcpPair(t)
	relaySide, agentSide := mux.New(c, mux.Config{}), mux.New(s, mux.Config{Client: true})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		relaySide.Close()
		agentSide.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			st, err := agentSide.Accept()
			if err != nil {
				return
			}
			conn, err := net.Dial("tcp", backend)
			if err != nil {
				st.Reset(mux.CodeRefused)
				continue
			}
			wg.Add(1)
			splice.Start(st, conn, func(splice.Result) { wg.Done() })
		}
	})
	// The transport a version 2 tunnel's pool uses.
	tr := &h1.Client{Open: func(ctx context.Context) (*mux.Stream, error) { return relaySide.Open(ctx, nil) }}
	t.Cleanup(func() { tr.CloseIdle(true) })
	cfg.Agents, cfg.Tunnels = http.NotFoundHandler(), http.NotFoundHandler()
	cfg.Transport = tr
	h := NewHandler(cfg)
	returned := make(chan struct{}, 1024)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { returned <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return h, srv.Listener.Addr().String(), returned
}

func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c, <-accepted
}

// dialUpgrade asks relay for an upgrade to proto and returns the
// connection and the answer's head.
func dialUpgrade(t *testing.T, relay, proto, extra string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", relay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /client/dev/ws HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s\r\n", proto, extra)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	return c, br, resp
}

func echo(t *testing.T, c net.Conn, br *bufio.Reader, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	io.WriteString(c, msg+"\n")
	if got, err := br.ReadString('\n'); err != nil || got != msg+"\n" {
		t.Fatalf("echo of %q: %q, %v", msg, got, err)
	}
}

// An upgraded connection is handed over: the handler returns while it
// carries on, WaitIdle waits for it, and what the user sent right after
// its request reaches the device first.
func TestUpgradeReturnsTheHandler(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	h, relay, returned := upgradeRelay(t, echoUpgrades(t), Config{})
	c, br, resp := dialUpgrade(t, relay, "echo", "")
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "echo" {
		t.Fatalf("answer %s, Upgrade %q", resp.Status, resp.Header.Get("Upgrade"))
	}
	echo(t, c, br, "hello")
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler still runs while the upgraded connection is idle")
	}
	echo(t, c, br, strings.Repeat("big", 50000))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := h.WaitIdle(ctx); err == nil {
		t.Fatal("WaitIdle returned while an upgraded connection is open")
	}
	c.Close()
	if err := h.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Bytes sent with the request, before the 101.
	c2, err := net.Dial("tcp", relay)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	io.WriteString(c2, "GET /client/dev/ws HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nearly\n")
	br2 := bufio.NewReader(c2)
	if resp, err := http.ReadResponse(br2, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("answer %v, %v", resp, err)
	}
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := br2.ReadString('\n'); err != nil || got != "early\n" {
		t.Fatalf("the bytes sent with the request came back as %q, %v", got, err)
	}
	c2.Close()
	if err := h.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A device that switches to another protocol than the one asked for is
// refused, as httputil.ReverseProxy refuses it.
func TestUpgradeOfAnotherProtocolRefused(t *testing.T) {
	_, relay, _ := upgradeRelay(t, echoUpgrades(t), Config{})
	_, _, resp := dialUpgrade(t, relay, "echo", "X-Answer: other\r\n")
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), `"other" when "echo" was requested`) {
		t.Fatalf("answer %s %q, want 502 naming both protocols", resp.Status, b)
	}
}

// Ending the detached context (a revoked token) ends the connection.
func TestUpgradeEndsWithItsContext(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	revoke := make(chan context.CancelFunc, 1)
	h, relay, _ := upgradeRelay(t, echoUpgrades(t), Config{
		Detach: func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			revoke <- cancel
			return ctx, cancel
		},
	})
	c, br, _ := dialUpgrade(t, relay, "echo", "")
	echo(t, c, br, "hello")
	(<-revoke)()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("read after the context ended: %v, want EOF", err)
	}
	if err := h.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Idle upgraded connections cost the relay no copy buffers and at most two
// goroutines each; the agent's side of the stream adds two more, the
// backend's echo one. Nothing of the server's state for the request (its
// buffers, the parsed request) is kept once the connection is handed
// over, though what carries the stream (h1's client, as in a version 2
// tunnel) keeps the forwarded request's context, which holds the proxy's
// trace of 1xx answers.
func TestIdleUpgradesAreCheap(t *testing.T) {
	const conns = 64
	backend := echoUpgrades(t)
	_, relay, _ := upgradeRelay(t, backend, Config{})
	heap := func() int64 {
		runtime.GC()
		runtime.GC() // a pool's buffers survive one collection
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	dialUpgrade(t, relay, "echo", "") // the servers' and the transport's first allocations
	base, goroutines := heap(), runtime.NumGoroutine()
	for i := range conns {
		c, br, _ := dialUpgrade(t, relay, "echo", "")
		echo(t, c, br, fmt.Sprint("hello ", i))
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		g := (runtime.NumGoroutine() - goroutines) / conns
		per := (heap() - base) / conns
		if g > 5 || per > 12<<10 {
			return fmt.Errorf("%d goroutines and %d bytes of heap per idle upgraded connection (its relay, agent, backend and client), want at most 5 and 12 KiB", g, per)
		}
		return nil
	})
}

// A user's half-close reaches a device whose side can be half-closed,
// which still answers, as through httputil.ReverseProxy.
func TestUpgradeHalfClose(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	device := make(chan net.Conn, 1)
	h := NewHandler(Config{
		Agents: http.NotFoundHandler(), Tunnels: http.NotFoundHandler(),
		Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			relaySide, deviceSide := tcpPair(t)
			device <- deviceSide
			return &http.Response{
				StatusCode: http.StatusSwitchingProtocols, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header:  http.Header{"Connection": {"Upgrade"}, "Upgrade": {"echo"}},
				Body:    relaySide.(*net.TCPConn), // a body that can be half-closed, as version 1's is
				Request: r,
			}, nil
		}),
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	c, br, resp := dialUpgrade(t, srv.Listener.Addr().String(), "echo", "")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("answer %s", resp.Status)
	}
	d := <-device
	defer d.Close()
	io.WriteString(c, "question")
	c.(*net.TCPConn).CloseWrite()
	d.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(d); err != nil || string(got) != "question" {
		t.Fatalf("the device read %q, %v; want the question, then the end", got, err)
	}
	io.WriteString(d, "answer")
	d.(*net.TCPConn).CloseWrite()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(br); err != nil || string(got) != "answer" {
		t.Fatalf("the user read %q, %v; want the answer after its half-close", got, err)
	}
	if err := h.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
}
