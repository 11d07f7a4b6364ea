package agent

import (
	"net"
	"testing"
	"time"
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
