package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })

func get(t *testing.T, pool *Pool) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://dev/", nil)
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatalf("round trip: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestRequestOverPipe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	relayEnd, agentEnd := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		Serve(ctx, agentEnd, hello, Liveness{})
	}()
	pool := NewPool(Liveness{}, nil)
	s, err := pool.Add(relayEnd, "dev", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := get(t, pool); got != "hello" {
		t.Fatalf("got %q", got)
	}
	cancel()
	<-served
	<-s.Done()
	if pool.Has("dev") {
		t.Fatal("a closed session stayed in the pool")
	}
}

// deadOnArrival is a tunnel connection whose agent is already gone: writes
// vanish and reads fail, so HTTP/2 dies as it starts.
type deadOnArrival struct{ net.Conn }

func (deadOnArrival) Read([]byte) (int, error)         { return 0, io.ErrUnexpectedEOF }
func (deadOnArrival) Write(p []byte) (int, error)      { return len(p), nil }
func (deadOnArrival) Close() error                     { return nil }
func (deadOnArrival) SetDeadline(time.Time) error      { return nil }
func (deadOnArrival) SetReadDeadline(time.Time) error  { return nil }
func (deadOnArrival) SetWriteDeadline(time.Time) error { return nil }

// TestDeadOnArrivalNeverJoins adds a connection that dies after HTTP/2
// started on it and before the session joined the pool: it must not stay.
func TestDeadOnArrivalNeverJoins(t *testing.T) {
	pool := NewPool(Liveness{}, nil)
	died := make(chan struct{}, 1)
	pool.OnChange = func() {
		select {
		case died <- struct{}{}:
		default:
		}
	}
	testHookStarted = func() { <-died }
	defer func() { testHookStarted = nil }()
	if _, err := pool.Add(deadOnArrival{}, "dev", "", ""); err == nil {
		t.Error("a tunnel that died as it opened was added")
	}
	if pool.Has("dev") || pool.Sessions() != 0 {
		t.Fatalf("%d dead sessions stayed in the pool", pool.Sessions())
	}
}

func TestUpgradeOverTunnel(t *testing.T) {
	{
		backendEnd, userEnd := net.Pipe()
		upgrader := UpgradeHandler(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Header.Get("Upgrade") != "echo" || !strings.EqualFold(r.Header.Get("Connection"), "upgrade") {
				t.Errorf("backend saw Upgrade %q Connection %q", r.Header.Get("Upgrade"), r.Header.Get("Connection"))
			}
			go func() { io.Copy(userEnd, userEnd) }() // the backend echoes
			return &http.Response{StatusCode: http.StatusSwitchingProtocols, Header: http.Header{"Upgrade": {"echo"}, "Connection": {"Upgrade"}},
				Body: backendEnd}, nil
		}), func(r *http.Request) *http.Request { return r.Clone(r.Context()) }, hello)

		ctx, cancel := context.WithCancel(context.Background())
		relayEnd, agentEnd := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			Serve(ctx, agentEnd, upgrader, Liveness{})
		}()
		pool := NewPool(Liveness{}, nil)
		if _, err := pool.Add(relayEnd, "dev", "", ""); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://dev/ws", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		resp, err := pool.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "echo" {
			t.Fatalf("got %d Upgrade %q", resp.StatusCode, resp.Header.Get("Upgrade"))
		}
		rw := resp.Body.(io.ReadWriteCloser)
		for _, msg := range []string{"one", "two", strings.Repeat("x", 100_000)} {
			if _, err := io.WriteString(rw, msg); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, len(msg))
			if _, err := io.ReadFull(rw, buf); err != nil || string(buf) != msg {
				t.Fatalf("echo of %d bytes: err %v", len(msg), err)
			}
		}
		rw.Close()
		userEnd.Close()
		cancel()
		<-served
		pool.Close()
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestDrainWaitsUntilMovable: while no other relay would take the device,
// a draining pool keeps its session and asks again later; once one would,
// the session is sent on.
func TestDrainWaitsUntilMovable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := NewPool(Liveness{}, nil)
	defer pool.Close()
	add := func(device string) (*Session, chan struct{}) {
		relayEnd, agentEnd := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			Serve(ctx, agentEnd, hello, Liveness{})
		}()
		s, err := pool.Add(relayEnd, device, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return s, served
	}
	stays, stayServed := add("stays")
	moves, moveServed := add("moves")

	var mu sync.Mutex
	may := false
	askedMoves := make(chan struct{}, 16)
	pool.DrainSessions(time.Second, func(device string) bool {
		mu.Lock()
		defer mu.Unlock()
		if device == "moves" {
			select {
			case askedMoves <- struct{}{}:
			default:
			}
		}
		return may && device == "moves"
	})
	for range 2 {
		select {
		case <-askedMoves:
		case <-time.After(10 * time.Second):
			t.Fatal("the drain did not ask twice whether the device may move")
		}
	}
	select {
	case <-moves.Done():
		t.Fatal("a session was sent on while no other relay would take it")
	default:
	}
	mu.Lock()
	may = true
	mu.Unlock()
	select {
	case <-moves.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session was not sent on once another relay would take it")
	}
	<-moveServed
	pool.StopDraining()
	select {
	case <-stays.Done():
		t.Fatal("the session whose device may not move was sent on")
	default:
	}
	if !pool.Has("stays") {
		t.Fatal("the session that stays left the pool")
	}
	cancel()
	<-stayServed
	<-stays.Done()
}

// TestDrainDeviceSendsOnlyItsAgents: DrainDevice sends the sessions of one
// device a GOAWAY, and a stream in flight on them finishes first; the
// other devices' sessions stay.
func TestDrainDeviceSendsOnlyItsAgents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := NewPool(Liveness{}, nil)
	defer pool.Close()
	release := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		io.WriteString(w, "late")
	})
	var served sync.WaitGroup
	add := func(device string) *Session {
		relayEnd, agentEnd := net.Pipe()
		served.Go(func() { Serve(ctx, agentEnd, slow, Liveness{}) })
		s, err := pool.Add(relayEnd, device, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	back, stays := add("back"), add("stays")
	answer := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://back/x", nil)
		resp, err := pool.RoundTrip(req)
		if err != nil {
			answer <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- string(b)
	}()
	testkit.Eventually(t, 5*time.Second, func() error {
		if back.Inflight() == 0 {
			return errors.New("the request has not reached the agent")
		}
		return nil
	})
	if n := pool.DrainDevice("back"); n != 1 {
		t.Fatalf("DrainDevice asked %d sessions, want 1", n)
	}
	if pool.Ready("back") {
		t.Error("a device whose agent was sent back still takes new requests here")
	}
	close(release)
	if got := <-answer; got != "late" {
		t.Errorf("the stream in flight got %q, want it finished", got)
	}
	select {
	case <-back.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session sent back did not end")
	}
	select {
	case <-stays.Done():
		t.Fatal("another device's session ended")
	default:
	}
	if n := pool.DrainDevice("back"); n != 0 {
		t.Errorf("a second DrainDevice asked %d sessions", n)
	}
	cancel()
	served.Wait()
}
