package agent

import (
	"net"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// TestWatchedConnSilent: the relay fell silent only when this side closed
// the connection first and nothing had come from the relay for the
// liveness timeout; a relay that closed, or one just heard from when a
// failed write made this side close, went away instead.
func TestWatchedConnSilent(t *testing.T) {
	read := func(c *watchedConn, peer net.Conn) {
		go peer.Write([]byte("x"))
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("the relay closed", func(t *testing.T) {
		a, b := net.Pipe()
		c := &watchedConn{Conn: a}
		up := time.Now()
		read(c, b)
		b.Close()
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("read after the peer closed succeeded")
		}
		c.Close()
		if c.silent(up, 0) {
			t.Error("a relay that closed the connection counts as silent")
		}
	})
	t.Run("this side closed, the relay just heard from", func(t *testing.T) {
		a, b := net.Pipe()
		defer b.Close()
		c := &watchedConn{Conn: a}
		up := time.Now()
		read(c, b)
		c.Close()
		if c.silent(up, time.Hour) {
			t.Error("a relay heard from a moment ago counts as silent")
		}
	})
	t.Run("this side closed after the relay was quiet", func(t *testing.T) {
		a, b := net.Pipe()
		defer b.Close()
		c := &watchedConn{Conn: a}
		up := time.Now()
		read(c, b)
		c.Close()
		if !c.silent(up, 0) {
			t.Error("a relay quiet for the whole timeout does not count as silent")
		}
	})
}

// TestWalkerFirstTriesTheStandby: a lost tunnel whose standby stood by
// sends the agent to the standby's relay first, naming the lost relay
// unreachable, then the rest of the list as before, without trying that
// relay twice.
func TestWalkerFirstTriesTheStandby(t *testing.T) {
	w := newWalker([]*url.URL{{Scheme: "http", Host: "entry"}})
	w.connected(candidate{url: &url.URL{Scheme: "http", Host: "a"}, id: "rl-a"}, tunnel.Placed{RelayID: "rl-a", Relays: []tunnel.RelayAddr{
		{ID: "rl-a", URL: "http://a"}, {ID: "rl-b", URL: "http://b"}, {ID: "rl-c", URL: "http://c"},
	}})
	w.lost(false, time.Now())
	w.first(tunnel.RelayAddr{ID: "rl-c", URL: "http://c"})
	if _, h := w.target(); h.Get(tunnel.UnreachableHeader) != "rl-a" {
		t.Fatalf("the agent names %q unreachable, want the lost rl-a", h.Get(tunnel.UnreachableHeader))
	}
	var got []string
	for {
		c, _ := w.target()
		got = append(got, c.id)
		if !w.failed(c) {
			break
		}
	}
	if want := []string{"rl-c", "rl-b", "rl-a"}; !slices.Equal(got, want) {
		t.Fatalf("the agent tried %v, want %v", got, want)
	}

	w.connected(candidate{url: &url.URL{Scheme: "http", Host: "a"}, id: "rl-a"}, tunnel.Placed{RelayID: "rl-a"})
	w.lost(true, time.Now())
	w.first(tunnel.RelayAddr{ID: "rl-a", URL: "http://a"}) // the lost relay itself: no change
	w.first(tunnel.RelayAddr{ID: "rl-d", URL: "::bad"})    // not a URL: no change
	if c, _ := w.target(); c.id != "rl-b" {
		t.Fatalf("after a silent relay the agent tries %q first, want rl-b", c.id)
	}
}
