package h1

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
)

// TestH1IdlePoolBoundsAndSweep: the pool keeps MaxIdle streams at
// most, the oldest going first; take skips streams idle past
// IdleTimeout; sweep resets those and keeps the others.
func TestH1IdlePoolBoundsAndSweep(t *testing.T) {
	a, b := net.Pipe()
	relay := mux.New(a, mux.Config{})
	agent := mux.New(b, mux.Config{Client: true})
	defer relay.Close()
	defer agent.Close()
	c := &Client{Open: func(ctx context.Context) (*mux.Stream, error) { return relay.Open(ctx, nil) }}
	defer c.CloseIdle(true)
	var all []*mux.Stream
	for range MaxIdle + 1 {
		st, _ := c.Open(context.Background())
		all = append(all, st)
		c.put(st)
	}
	if n := c.NumIdle(); n != MaxIdle {
		t.Fatalf("%d idle, want %d", n, MaxIdle)
	}
	if all[0].Quiet() {
		t.Fatal("the oldest stream stayed open past the bound")
	}

	// Age every stream but the newest past the idle timeout.
	c.mu.Lock()
	for i := range c.idle[:len(c.idle)-1] {
		c.idle[i].since = time.Now().Add(-IdleTimeout)
	}
	c.mu.Unlock()
	c.sweep()
	if n := c.NumIdle(); n != 1 {
		t.Fatalf("%d idle after the sweep, want 1", n)
	}
	if !all[len(all)-1].Quiet() || all[1].Quiet() {
		t.Fatal("the sweep reset the wrong streams")
	}
	c.mu.Lock()
	c.idle[0].since = time.Now().Add(-IdleTimeout)
	c.mu.Unlock()
	if st := c.take(); st != nil {
		t.Fatal("take returned an expired stream")
	}
}
