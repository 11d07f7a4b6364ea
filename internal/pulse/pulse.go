// Package pulse is how a relay's watchdog hears from its peers: a
// connection, upgraded from the peer's GET /healthz, on which the
// watchdog sends a beat of eight bytes each probe interval and the peer
// sends every byte straight back.
//
// A probe over HTTP passes through half a dozen goroutines on the two
// relays (the server's frame reader, its serve loop, a handler, its frame
// writer; the client's read loop and the caller), and on a relay too busy
// to run them at once each waits its turn behind the relay's other work:
// a live relay's answers then arrive as late as a frozen one's do not. A
// beat is read and written back by the one goroutine that waits on its
// connection, and its echo is read by the one that waits on the other
// end, so that a busy relay's answer waits two turns, not six.
//
// A relay that does not know the protocol answers the upgrade request as
// a plain probe (200); its peers then go on probing it over HTTP.
package pulse

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/connect"
)

// Protocol is the upgrade token of a pulse.
const Protocol = "switchboard-pulse"

// beatSize is the size of one beat: its sequence number.
const beatSize = 8

// IsRequest reports whether r asks to upgrade to a pulse.
func IsRequest(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), Protocol)
}

// DefaultIdleTimeout is how long a pulse's server waits for a beat before
// it closes the connection, when Server.IdleTimeout is zero.
const DefaultIdleTimeout = time.Minute

// Server answers pulses: each upgraded connection echoes what it reads.
// It is safe for concurrent use; its zero value is ready.
type Server struct {
	// IdleTimeout closes a pulse that has sent no beat for this long.
	// Default DefaultIdleTimeout.
	IdleTimeout time.Duration

	wg     sync.WaitGroup
	mu     sync.Mutex // guards the fields below
	conns  map[net.Conn]struct{}
	closed bool
}

// ServeHTTP upgrades a pulse request and echoes its beats, on the
// request's own goroutine, until the peer closes, goes quiet for
// IdleTimeout, or Close is called.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !IsRequest(r) {
		w.Header().Set("Upgrade", Protocol)
		http.Error(w, "this endpoint takes the relays' pulses: GET with Upgrade: "+Protocol, http.StatusUpgradeRequired)
		return
	}
	conn, ok := connect.Hijack(w, Protocol)
	if !ok {
		return
	}
	if !s.add(conn) {
		conn.Close()
		return
	}
	defer s.remove(conn)
	s.echo(conn)
}

// echo writes back each read; a beat split over two reads is written
// back in the same two parts, which the peer reads as one.
func (s *Server) echo(conn net.Conn) {
	defer conn.Close()
	idle := s.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	var buf [8 * beatSize]byte
	for {
		conn.SetReadDeadline(time.Now().Add(idle))
		n, err := conn.Read(buf[:])
		if n > 0 {
			conn.SetWriteDeadline(time.Now().Add(idle))
			if _, werr := conn.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *Server) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) remove(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Close ends every pulse and waits for their goroutines: the relay stops,
// and its peers see their pulses end.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// sentRing is how many beats' send times a Conn remembers, to measure the
// round trip of each echo: six seconds of beats at 100 ms.
const sentRing = 64

// Conn is the watchdog's end of a pulse.
type Conn struct {
	conn  net.Conn
	echo  func(rtt time.Duration)
	ended func(error)
	done  chan struct{} // closed when the reader returns

	mu     sync.Mutex // guards the fields below
	seq    uint64     // the last beat sent
	sent   [sentRing]time.Time
	closed bool
}

// Dial opens a pulse with the relay whose base URL is base (http:// or
// https://, verified with tlsConf) within ctx. From then on echo is told
// the round trip of each beat that comes back (negative for a beat too
// old to time), and ended, once, why the pulse ended, unless Close ended
// it. Both are called on the Conn's reader, which nothing else waits on,
// and must return soon. A relay that does not speak the protocol refuses
// with a *connect.HandshakeError (status 200: it answered a plain probe).
func Dial(ctx context.Context, base string, tlsConf *tls.Config, echo func(rtt time.Duration), ended func(error)) (*Conn, error) {
	u, err := url.Parse(strings.TrimSuffix(base, "/") + "/healthz")
	if err != nil {
		return nil, err
	}
	conn, err := connect.DialUpgrade(ctx, u, tlsConf, Protocol, nil)
	if err != nil {
		return nil, err
	}
	c := &Conn{conn: conn, echo: echo, ended: ended, done: make(chan struct{})}
	go c.read()
	return c, nil
}

// Beat sends the next beat, giving up after timeout: a connection whose
// buffers are full is as good as silent, and the caller does not wait on it.
func (c *Conn) Beat(timeout time.Duration) error {
	c.mu.Lock()
	c.seq++
	seq := c.seq
	c.sent[seq%sentRing] = time.Now()
	c.mu.Unlock()
	var b [beatSize]byte
	binary.BigEndian.PutUint64(b[:], seq)
	c.conn.SetWriteDeadline(time.Now().Add(timeout))
	_, err := c.conn.Write(b[:])
	return err
}

// read takes the echoes until the connection ends.
func (c *Conn) read() {
	defer close(c.done)
	var b [beatSize]byte
	for {
		if _, err := io.ReadFull(c.conn, b[:]); err != nil {
			c.end(err)
			return
		}
		seq := binary.BigEndian.Uint64(b[:])
		now := time.Now()
		c.mu.Lock()
		if seq == 0 || seq > c.seq {
			c.mu.Unlock()
			c.end(errors.New("the peer sent back a beat never sent"))
			return
		}
		rtt := time.Duration(-1)
		if c.seq-seq < sentRing {
			rtt = now.Sub(c.sent[seq%sentRing])
		}
		c.mu.Unlock()
		c.echo(rtt)
	}
}

// end closes the connection and tells ended why, unless Close ended it.
func (c *Conn) end(err error) {
	c.conn.Close()
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if !closed {
		c.ended(err)
	}
}

// Close ends the pulse and waits for its reader.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	err := c.conn.Close()
	<-c.done
	return err
}
