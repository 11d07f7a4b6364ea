// Package livenesstest checks the tunnel's ping timing in virtual time. Its
// synctest bubble must be the only one in its process — x/net/http2 keeps
// channels in process-wide pools, which must not cross bubbles — so the test
// runs the bubble in a fresh child process every time (also under -count=N).
package livenesstest

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// freezable is a connection whose owner can freeze like a stopped process:
// it reads nothing more and what is written to it vanishes.
type freezable struct {
	net.Conn
	mu     sync.Mutex
	frozen bool
	thaw   chan struct{} // closed on Close, so that a frozen Read returns
}

func newFreezable(c net.Conn) *freezable { return &freezable{Conn: c, thaw: make(chan struct{})} }

func (f *freezable) freeze() {
	f.mu.Lock()
	f.frozen = true
	f.mu.Unlock()
}

func (f *freezable) isFrozen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen
}

func (f *freezable) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	if f.isFrozen() {
		<-f.thaw
		return 0, net.ErrClosed
	}
	return n, err
}

func (f *freezable) Write(p []byte) (int, error) {
	if f.isFrozen() {
		return len(p), nil
	}
	return f.Conn.Write(p)
}

func (f *freezable) Close() error {
	f.mu.Lock()
	select {
	case <-f.thaw:
	default:
		close(f.thaw)
	}
	f.mu.Unlock()
	return f.Conn.Close()
}

// drain keeps reading a frozen peer's pipe end, as a kernel buffer would.
func drain(c net.Conn) { io.Copy(io.Discard, c) }

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })

// connect opens a session over an in-memory pipe; the agent end is freezable.
func connect(t *testing.T, ctx context.Context, l tunnel.Liveness) (*tunnel.Pool, *tunnel.Session, *freezable, *freezable, chan struct{}) {
	relayEnd, agentEnd := net.Pipe()
	rf, af := newFreezable(relayEnd), newFreezable(agentEnd)
	served := make(chan struct{})
	go func() {
		defer close(served)
		tunnel.Serve(ctx, af, hello, l)
	}()
	pool := tunnel.NewPool(l, nil)
	s, err := pool.Add(rf, "dev", "", "inst")
	if err != nil {
		t.Fatal(err)
	}
	return pool, s, rf, af, served
}

// connectV2 is connect for a version 2 tunnel, whose agent's service
// answers every request with hello over an in-memory pipe.
func connectV2(t *testing.T, ctx context.Context, l tunnel.Liveness) (*tunnel.Pool, *tunnel.Session, *freezable, *freezable, chan struct{}) {
	relayEnd, agentEnd := net.Pipe()
	rf, af := newFreezable(relayEnd), newFreezable(agentEnd)
	served := make(chan struct{})
	go func() {
		defer close(served)
		tunnel.ServeStreams(ctx, af, l, func(context.Context, string) (net.Conn, error) {
			c, b := net.Pipe()
			go serveHello(b)
			return c, nil
		})
	}()
	pool := tunnel.NewPool(l, nil)
	s, err := pool.AddV2(rf, "dev", "", "inst", map[string]service.Announced{service.Default: {Name: service.Default, Kind: service.HTTP}})
	if err != nil {
		t.Fatal(err)
	}
	return pool, s, rf, af, served
}

// serveHello answers each HTTP/1.1 request on c with hello until c closes.
func serveHello(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"); err != nil {
			return
		}
	}
}

func get(t *testing.T, pool *tunnel.Pool) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://dev/", nil)
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatalf("round trip: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// TestFrozenPeersAreDetected freezes first an agent, then a relay, like a
// SIGSTOPped process, and measures in virtual time how long the other end
// takes to give it up. Both run in one bubble (see the package comment).
func TestFrozenPeersAreDetected(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		runInChild(t)
		return
	}
	synctest.Test(t, func(t *testing.T) {
		frozenAgent(t, connect)
		frozenRelay(t, connect)
		frozenAgent(t, connectV2)
		frozenRelay(t, connectV2)
	})
}

// connector opens a tunnel of one version; see connect.
type connector func(t *testing.T, ctx context.Context, l tunnel.Liveness) (*tunnel.Pool, *tunnel.Session, *freezable, *freezable, chan struct{})

func frozenAgent(t *testing.T, connect connector) {
	{
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		l := tunnel.Liveness{}.WithDefaults()
		pool, s, rf, af, served := connect(t, ctx, l)
		get(t, pool)
		af.freeze()
		go drain(rf.Conn) // nothing more reaches the frozen agent
		start := time.Now()
		<-s.Done()
		took := time.Since(start)
		t.Logf("noticed after %v (virtual time)", took)
		if limit := l.Interval + l.Timeout; took > limit {
			t.Fatalf("a frozen agent was noticed after %v, want ≤ %v", took, limit)
		}
		if pool.Has("dev") {
			t.Fatal("the dead session is still in the pool")
		}
		af.Close()
		<-served
		pool.Close()
	}
}

func frozenRelay(t *testing.T, connect connector) {
	{
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		l := tunnel.Liveness{}.WithDefaults()
		pool, _, rf, af, served := connect(t, ctx, l)
		get(t, pool)
		rf.freeze()
		go drain(af.Conn)
		start := time.Now()
		<-served // the agent's Serve returns once it gives the relay up
		took := time.Since(start)
		t.Logf("noticed after %v (virtual time)", took)
		if limit := l.Interval + l.Timeout; took > limit {
			t.Fatalf("a frozen relay was noticed after %v, want ≤ %v", took, limit)
		}
		rf.Close()
		pool.Close()
	}
}

// childEnv marks the child process that runs the bubble.
const childEnv = "SWITCHBOARD_LIVENESS_CHILD"

// runInChild runs this test again in a new process of the test binary.
func runInChild(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("child process:\n%s", out)
	if err != nil {
		t.Fatalf("the virtual-time run failed: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatal("the child process did not run the test")
	}
}
