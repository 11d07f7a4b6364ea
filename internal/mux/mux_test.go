package mux

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tcpPair returns two connected TCP sockets on loopback.
func tcpPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	return c, s
}

// sessions returns a client and a server session over c and s, closed at
// the end of the test.
func sessions(t testing.TB, c, s net.Conn, ccfg, scfg Config) (*Session, *Session) {
	t.Helper()
	ccfg.Client = true
	scfg.Client = false
	client, server := New(c, ccfg), New(s, scfg)
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

func tcpSessions(t testing.TB) (*Session, *Session) {
	c, s := tcpPair(t)
	return sessions(t, c, s, Config{}, Config{})
}

func accept(t testing.TB, s *Session) *Stream {
	t.Helper()
	st, err := s.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	return st
}

// TestConn runs x/net's conformance suite for net.Conn over a pair of
// streams: deadlines, concurrent use, close.
func TestConn(t *testing.T) {
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		c, s := tcpPair(t)
		client, server := New(c, Config{Client: true}), New(s, Config{})
		a, err := client.Open(context.Background(), []byte("nettest"))
		if err != nil {
			return nil, nil, nil, err
		}
		if err := a.flushOpen(); err != nil {
			return nil, nil, nil, err
		}
		b, err := server.Accept()
		if err != nil {
			return nil, nil, nil, err
		}
		return a, b, func() { client.Close(); server.Close() }, nil
	})
}

func TestOpenCarriesMetaAndData(t *testing.T) {
	client, server := tcpSessions(t)
	st, err := client.Open(context.Background(), []byte("service=web"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	peer := accept(t, server)
	if got := string(peer.Meta()); got != "service=web" {
		t.Fatalf("meta %q", got)
	}
	buf := make([]byte, 64)
	n, err := peer.Read(buf)
	if err != nil || string(buf[:n]) != "GET / HTTP/1.1\r\n\r\n" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}

// A stream that is opened and then read first (a server that speaks first,
// as SSH's does) must reach the peer before the read waits.
func TestOpenThenReadReachesThePeer(t *testing.T) {
	client, server := tcpSessions(t)
	st, err := client.Open(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		peer, err := server.Accept()
		if err != nil {
			return
		}
		peer.Write([]byte("SSH-2.0-test\r\n"))
		peer.CloseWrite()
	}()
	got, err := io.ReadAll(st)
	if err != nil || string(got) != "SSH-2.0-test\r\n" {
		t.Fatalf("read %q, %v", got, err)
	}
}

// Many streams at once, each with its own sizes both ways, arrive intact.
func TestManyStreamsBothWays(t *testing.T) {
	for _, tc := range []struct {
		name string
		pair func(testing.TB) (net.Conn, net.Conn)
	}{
		{"tcp", tcpPair},
		{"pipe", func(testing.TB) (net.Conn, net.Conn) { return net.Pipe() }}, // unbuffered, and no writev
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := tc.pair(t)
			client, server := sessions(t, c, s, Config{}, Config{})
			go echoServer(server)
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for i := range 64 {
				wg.Go(func() {
					size := []int{0, 1, 100, 16 << 10, 300 << 10, 2 << 20}[i%6] + i
					errs <- roundTrip(client, size, int64(i))
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			if t.Failed() {
				t.Logf("client: %v; server: %v", client.Err(), server.Err())
			}
		})
	}
}

// echoServer copies each accepted stream back to its opener, then
// half-closes it.
func echoServer(s *Session) {
	for {
		st, err := s.Accept()
		if err != nil {
			return
		}
		go func() {
			io.Copy(st, st)
			st.CloseWrite()
		}()
	}
}

// roundTrip sends size random bytes on a new stream and checks they come
// back.
func roundTrip(s *Session, size int, seed int64) error {
	data := make([]byte, size)
	rnd := rand.New(rand.NewPCG(uint64(seed), 1))
	for i := range data {
		data[i] = byte(rnd.Uint32())
	}
	st, err := s.Open(context.Background(), nil)
	if err != nil {
		return err
	}
	defer st.Close()
	werr := make(chan error, 1)
	go func() {
		_, err := st.Write(data)
		if err == nil {
			err = st.CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, st)
	if err != nil {
		return fmt.Errorf("stream %d read: %w", st.ID(), err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("stream %d write: %w", st.ID(), err)
	}
	if want := sha256.Sum256(data); n != int64(size) || !bytes.Equal(h.Sum(nil), want[:]) {
		return fmt.Errorf("stream %d: got %d bytes, want %d, or they differ", st.ID(), n, size)
	}
	return nil
}

func TestHalfClose(t *testing.T) {
	client, server := tcpSessions(t)
	st, _ := client.Open(context.Background(), nil)
	st.Write([]byte("request"))
	if err := st.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("more")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	peer := accept(t, server)
	got, err := io.ReadAll(peer)
	if err != nil || string(got) != "request" {
		t.Fatalf("peer read %q, %v", got, err)
	}
	// The other direction is still open.
	peer.Write([]byte("answer"))
	peer.CloseWrite()
	got, err = io.ReadAll(st)
	if err != nil || string(got) != "answer" {
		t.Fatalf("read %q, %v", got, err)
	}
	eventually(t, func() bool { return client.NumStreams() == 0 && server.NumStreams() == 0 })
}

func TestResetBothWays(t *testing.T) {
	client, server := tcpSessions(t)
	st, _ := client.Open(context.Background(), nil)
	st.Write([]byte("x"))
	peer := accept(t, server)
	peer.Read(make([]byte, 1))
	if err := peer.Reset(CodeApplication + 7); err != nil {
		t.Fatal(err)
	}
	var re *ResetError
	_, err := st.Read(make([]byte, 1))
	if !errors.As(err, &re) || re.Code != CodeApplication+7 || !re.Remote {
		t.Fatalf("read after the peer's reset: %v", err)
	}
	if _, err := st.Write([]byte("y")); !errors.As(err, &re) {
		t.Fatalf("write after the peer's reset: %v", err)
	}
	if _, err := peer.Read(make([]byte, 1)); !errors.As(err, &re) || re.Remote {
		t.Fatalf("read after own reset: %v", err)
	}

	// The other way: the opener cancels while the acceptor writes.
	st2, _ := client.Open(context.Background(), nil)
	st2.Write([]byte("x"))
	peer2 := accept(t, server)
	blocked := make(chan error, 1)
	go func() {
		_, err := peer2.Write(make([]byte, 4*InitialWindow)) // more than the credit: blocks
		blocked <- err
	}()
	st2.Reset(CodeCancel)
	if err := <-blocked; !errors.As(err, &re) || re.Code != CodeCancel {
		t.Fatalf("blocked write after the opener's reset: %v", err)
	}
}

// Close delivers what was written, then ends the peer's writes.
func TestCloseDeliversThenStopsThePeer(t *testing.T) {
	client, server := tcpSessions(t)
	st, _ := client.Open(context.Background(), nil)
	st.Write([]byte("last words"))
	st.Close()
	peer := accept(t, server)
	got, err := io.ReadAll(peer)
	if err != nil || string(got) != "last words" {
		t.Fatalf("read %q, %v", got, err)
	}
	var re *ResetError
	eventually(t, func() bool {
		_, err := peer.Write([]byte("x"))
		return errors.As(err, &re) && re.Code == CodeClosed
	})
}

// A reader that does not read holds the writer at its credit: the
// receiver buffers no more than the window.
func TestFlowControlHoldsTheWriter(t *testing.T) {
	client, server := tcpSessions(t)
	st, _ := client.Open(context.Background(), nil)
	st.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := st.Write(make([]byte, 8*InitialWindow))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past the credit: %d bytes, %v", n, err)
	}
	if n != InitialWindow {
		t.Fatalf("wrote %d bytes before the deadline, want the initial window %d", n, InitialWindow)
	}
	peer := accept(t, server)
	eventually(t, func() bool {
		peer.mu.Lock()
		defer peer.mu.Unlock()
		return peer.buffered == InitialWindow
	})
	// Reading frees credit; the writer goes on.
	st.SetWriteDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := st.Write(make([]byte, 3*InitialWindow))
		done <- err
	}()
	if _, err := io.CopyN(io.Discard, peer, 4*InitialWindow); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRefused(t *testing.T) {
	c, s := tcpPair(t)
	client, _ := sessions(t, c, s, Config{}, Config{RefuseStreams: true})
	st, _ := client.Open(context.Background(), nil)
	st.Write([]byte("x"))
	_, err := st.Read(make([]byte, 1))
	var re *ResetError
	if !errors.As(err, &re) || !re.Refused() {
		t.Fatalf("read of a refused stream: %v", err)
	}
}

func TestBacklogFullRefuses(t *testing.T) {
	c, s := tcpPair(t)
	client, server := sessions(t, c, s, Config{}, Config{AcceptBacklog: 2})
	var streams []*Stream
	for range 3 {
		st, _ := client.Open(context.Background(), nil)
		st.Write([]byte("x"))
		streams = append(streams, st)
	}
	_, err := streams[2].Read(make([]byte, 1))
	var re *ResetError
	if !errors.As(err, &re) || !re.Refused() {
		t.Fatalf("third stream over a backlog of 2: %v", err)
	}
	accept(t, server)
	accept(t, server)
}

func TestGoAway(t *testing.T) {
	client, server := tcpSessions(t)
	open, _ := client.Open(context.Background(), nil)
	open.Write([]byte("ping"))
	peer := accept(t, server)
	select {
	case <-client.PeerGoneAway():
		t.Fatal("PeerGoneAway closed before any GOAWAY")
	default:
	}
	if err := server.GoAway(7); err != nil {
		t.Fatal(err)
	}
	server.GoAway(7) // a second one changes nothing
	select {
	case <-client.PeerGoneAway():
	case <-time.After(5 * time.Second):
		t.Fatal("PeerGoneAway not closed by the peer's GOAWAY")
	}
	eventually(t, func() bool {
		_, err := client.Open(context.Background(), nil)
		return errors.Is(err, ErrGoAway)
	})
	// The open stream carries on.
	peer.Write([]byte("pong"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(open, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

func TestPing(t *testing.T) {
	client, server := tcpSessions(t)
	for _, s := range []*Session{client, server} {
		rtt, err := s.Ping(context.Background())
		if err != nil || rtt <= 0 {
			t.Fatalf("ping: %v, %v", rtt, err)
		}
	}
}

func TestCloseEndsStreamsAndAccept(t *testing.T) {
	client, server := tcpSessions(t)
	st, _ := client.Open(context.Background(), nil)
	st.Write([]byte("x"))
	peer := accept(t, server)
	accepted := make(chan error, 1)
	go func() {
		_, err := server.Accept()
		accepted <- err
	}()
	reading := make(chan error, 1)
	go func() {
		_, err := peer.Read(make([]byte, 10))
		_, err = peer.Read(make([]byte, 10))
		reading <- err
	}()
	client.Close()
	if err := <-reading; err == nil {
		t.Fatal("read on a closed session succeeded")
	}
	if err := <-accepted; err == nil {
		t.Fatal("accept on a closed session succeeded")
	}
	if _, err := client.Open(context.Background(), nil); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("open on a closed session: %v", err)
	}
}

// The window grows to what a long fat link holds: over a link with 40 ms
// of latency each way, one stream's download reaches several times what
// the initial window allows.
func TestWindowGrowsWithTheLink(t *testing.T) {
	c, s := tcpPair(t)
	slow := newLatencyConn(c, 40*time.Millisecond)
	client, server := sessions(t, slow, s, Config{}, Config{})
	go func() {
		st, err := server.Accept()
		if err != nil {
			return
		}
		st.Write(make([]byte, 32<<20))
		st.CloseWrite()
	}()
	st, _ := client.Open(context.Background(), nil)
	if _, err := io.Copy(io.Discard, st); err != nil {
		t.Fatal(err)
	}
	if w := client.window.Load(); w < 4*InitialWindow {
		t.Fatalf("window %d after 32 MiB over an 80 ms round trip; want it grown from %d", w, InitialWindow)
	}
}

// latencyConn delays what it reads by d, as a link with latency would.
type latencyConn struct {
	net.Conn
	d    time.Duration
	pr   *io.PipeReader
	done chan struct{}
}

func newLatencyConn(c net.Conn, d time.Duration) *latencyConn {
	pr, pw := io.Pipe()
	lc := &latencyConn{Conn: c, d: d, pr: pr, done: make(chan struct{})}
	type piece struct {
		at   time.Time
		data []byte
	}
	q := make(chan piece, 1<<14)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := c.Read(b)
			if n > 0 {
				q <- piece{time.Now().Add(d), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer close(lc.done)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for p := range q {
			timer.Reset(time.Until(p.at)) // the link's latency
			<-timer.C
			if _, err := pw.Write(p.data); err != nil {
				break
			}
		}
		pw.Close()
		for range q {
		}
	}()
	return lc
}

func (c *latencyConn) Read(p []byte) (int, error) { return c.pr.Read(p) }
func (c *latencyConn) Close() error {
	err := c.Conn.Close()
	c.pr.Close()
	<-c.done
	return err
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		if !cond() {
			return errors.New("not yet")
		}
		return nil
	})
}

// TestSmallExchangesProbeRarely: small requests and answers, which could
// never fill the window in a round trip, start a bandwidth-delay probe (a
// ping, and a goroutine to write it at each end) every window/4 bytes, not
// one per exchange.
func TestSmallExchangesProbeRarely(t *testing.T) {
	client, server := tcpSessions(t)
	go func() {
		st, err := server.Accept()
		if err != nil {
			return
		}
		b := make([]byte, 200)
		for {
			if _, err := io.ReadFull(st, b); err != nil {
				return
			}
			if _, err := st.Write(b); err != nil {
				return
			}
		}
	}()
	st, err := client.Open(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const exchanges = 500
	b := make([]byte, 200)
	for range exchanges {
		if _, err := st.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(st, b); err != nil {
			t.Fatal(err)
		}
	}
	client.mu.Lock()
	probes := 0
	if client.bdp != nil {
		probes = int(client.bdp.probes)
	}
	client.mu.Unlock()
	if most := exchanges*200/(InitialWindow/4) + 1; probes > most {
		t.Errorf("%d probes over %d exchanges of 200 bytes, want at most %d", probes, exchanges, most)
	}
}

// TestAfterFunc: a function given to AfterFunc runs once the session has
// ended, when the peer goes; one given after the end runs at once.
func TestAfterFunc(t *testing.T) {
	client, server := tcpSessions(t)
	ended := make(chan error, 2)
	server.AfterFunc(func() { ended <- server.Err() })
	select {
	case err := <-ended:
		t.Fatalf("ran while the session was open (err %v)", err)
	default:
	}
	client.Close()
	if err := <-ended; err == nil {
		t.Fatal("ran before the session had ended")
	}
	server.AfterFunc(func() { ended <- server.Err() })
	if err := <-ended; err == nil {
		t.Fatal("ran before the session had ended")
	}
}
