package tunnel

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestHTTPStreamLeavingEnds: an idle version 2 session holds no leaving
// context; the one its streams get ends when the session is drained (it
// then takes no new stream) or when it leaves the pool.
func TestHTTPStreamLeavingEnds(t *testing.T) {
	pool, add := v2Pool(t)
	done := func(ctx context.Context) bool {
		select {
		case <-ctx.Done():
			return true
		default:
			return false
		}
	}

	drained, _ := add("drained")
	pool.mu.Lock()
	idle := drained.leaving
	pool.mu.Unlock()
	if idle != nil {
		t.Error("an idle session holds a leaving context before any stream needed it")
	}
	st, err := pool.OpenHTTP(context.Background(), "drained")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Done()
	if done(st.Leaving) {
		t.Fatal("a stream's Leaving ended while its session is in the pool")
	}
	pool.DrainDevice("drained")
	if !done(st.Leaving) {
		t.Error("a stream's Leaving did not end when its session was drained")
	}
	if _, err := pool.OpenHTTP(context.Background(), "drained"); !errors.Is(err, ErrNoAgent) {
		t.Errorf("a stream opened on a draining session: %v, want ErrNoAgent", err)
	}

	_, agent := add("gone")
	st2, err := pool.OpenHTTP(context.Background(), "gone")
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Done()
	agent.Close()
	testkit.Eventually(t, 5*time.Second, func() error {
		if !done(st2.Leaving) {
			return errors.New("a stream's Leaving did not end when its session left the pool")
		}
		return nil
	})
}

// v2Pool returns a pool, closed when the test ends, and add, which joins
// a version 2 session of device to it over a loopback connection and
// returns it and the agent's end.
func v2Pool(t *testing.T) (*Pool, func(device string) (*Session, *mux.Session)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	pool := NewPool(Liveness{Interval: time.Hour, Timeout: time.Hour}, nil)
	t.Cleanup(pool.Close)
	services, err := service.ParseAnnouncement(announce(t, service.Service{Name: service.Default, Kind: service.HTTP, Addr: "127.0.0.1:1"}))
	if err != nil {
		t.Fatal(err)
	}
	return pool, func(device string) (*Session, *mux.Session) {
		t.Helper()
		agentEnd, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		agent := mux.New(agentEnd, mux.Config{Client: true})
		t.Cleanup(func() { agent.Close() })
		relayEnd, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		s, err := pool.AddV2(relayEnd, device, "", "", services)
		if err != nil {
			t.Fatal(err)
		}
		return s, agent
	}
}

// TestRetiredSessionIsNotReady: a version 2 session whose agent sent
// GOAWAY (it retires the tunnel, whose streams may go on for hours) takes
// no new stream, so the device is not Ready through it, and the pool
// tells of the change at once for requests that wait.
func TestRetiredSessionIsNotReady(t *testing.T) {
	pool, add := v2Pool(t)
	changed := make(chan struct{}, 16)
	pool.OnChange = func() { changed <- struct{}{} }
	_, agent := add("dev")
	<-changed // joined
	if !pool.Ready("dev") {
		t.Fatal("a new session is not ready")
	}
	if err := agent.GoAway(0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("the pool did not tell of the agent's GOAWAY")
	}
	if pool.Ready("dev") {
		t.Error("the device is ready through a session its agent retired")
	}
	if _, err := pool.OpenHTTP(context.Background(), "dev"); !errors.Is(err, ErrNoAgent) {
		t.Errorf("a stream opened on a retired session: %v, want ErrNoAgent", err)
	}
}
