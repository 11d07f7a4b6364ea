package mux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// quickIdle makes sessions idle after 20 ms without a stream, for the
// test.
func quickIdle(t *testing.T) {
	d := handOffAfter
	t.Cleanup(func() { handOffAfter = d }) // after the sessions' cleanups
	handOffAfter = 20 * time.Millisecond
}

// parked reports whether the session is parked now.
func parked(s *Session) bool {
	parking.mu.Lock()
	defer parking.mu.Unlock()
	return parking.parked[s.raw.parkID] == s
}

func waitParked(t *testing.T, all ...*Session) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() error {
		for i, s := range all {
			if !parked(s) {
				return fmt.Errorf("session %d of %d is not parked", i, len(all))
			}
		}
		return nil
	})
}

// parkByPings pings from each client until it and its server are
// parked: a session parks when a read finds its socket empty after it
// has been idle for a while, so a session that reads nothing never does.
func parkByPings(t *testing.T, clients, servers []*Session) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() error {
		for i, client := range clients {
			if parked(client) && parked(servers[i]) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := client.Ping(ctx)
			cancel()
			if err != nil {
				t.Fatalf("ping %d: %v", i, err)
			}
			return fmt.Errorf("pair %d of %d is not parked", i, len(clients))
		}
		return nil
	})
}

func pollerRuns() bool {
	parking.mu.Lock()
	defer parking.mu.Unlock()
	return parking.running
}

// TestParkedSessionsHoldNoGoroutine: idle sessions hold no goroutine but
// the one poller of them all, and each wakes for a ping and for a stream
// the peer opens, whose answer it reads, and parks again after.
func TestParkedSessionsHoldNoGoroutine(t *testing.T) {
	quickIdle(t)
	const pairs = 100
	base := runtime.NumGoroutine()
	var clients, servers []*Session
	for range pairs {
		c, s := tcpPair(t)
		client, server := sessions(t, c, s, Config{}, Config{})
		clients = append(clients, client)
		servers = append(servers, server)
	}
	all := append(append([]*Session(nil), clients...), servers...)
	parkByPings(t, clients, servers)
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := runtime.NumGoroutine() - base; n > 1 {
			return fmt.Errorf("%d goroutines for %d parked sessions, want the poller's alone", n, len(all))
		}
		return nil
	})

	// Pings: the server is woken by the ping, the client by its answer.
	for i, client := range clients {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.Ping(ctx)
		cancel()
		if err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	waitParked(t, all...)

	// Streams: the server opens one (its own write needs no reader), the
	// client answers, and the server reads the answer.
	for i, server := range servers {
		st, err := server.Open(context.Background(), []byte("svc"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write([]byte("ask")); err != nil {
			t.Fatal(err)
		}
		peer := accept(t, clients[i])
		buf := make([]byte, 3)
		if _, err := io.ReadFull(peer, buf); err != nil || string(buf) != "ask" {
			t.Fatalf("stream %d: read %q, %v", i, buf, err)
		}
		if _, err := peer.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		}
		peer.CloseWrite()
		got, err := io.ReadAll(st)
		if err != nil || string(got) != "answer" {
			t.Fatalf("stream %d: answer %q, %v", i, got, err)
		}
		st.Close()
		peer.Close()
	}
	parkByPings(t, clients, servers) // the streams made them busy: idle again
	for _, s := range all {
		if err := s.Err(); err != nil {
			t.Fatalf("a parked session ended: %v", err)
		}
	}
	for _, s := range all {
		s.Close()
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if pollerRuns() {
			return errors.New("the poller runs with no session parked")
		}
		return nil
	})
}

// TestCloseWhileParked: a parked session closed (by Close, or by its
// liveness check) ends as one that was reading does: once, its reader
// counted out, the peer told.
func TestCloseWhileParked(t *testing.T) {
	quickIdle(t)
	c, s := tcpPair(t)
	client, server := sessions(t, c, s, Config{}, Config{})
	parkByPings(t, []*Session{client}, []*Session{server})
	var ended atomic.Int32
	client.AfterFunc(func() { ended.Add(1) })
	closed := make(chan struct{})
	go func() { client.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close of a parked session did not return")
	}
	if err := client.Err(); err != ErrSessionClosed {
		t.Fatalf("closed session's error %v, want %v", err, ErrSessionClosed)
	}
	// The server, parked too, is woken by the socket's end.
	select {
	case <-server.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the parked peer did not see the end")
	}
	client.Close()
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := ended.Load(); n != 1 {
			return fmt.Errorf("end ran %d times, want once", n)
		}
		return nil
	})
}

// TestParkedSessionTimesOut: a parked session whose peer falls silent
// ends with ErrTimeout from its liveness timer.
func TestParkedSessionTimesOut(t *testing.T) {
	quickIdle(t)
	c, s := tcpPair(t)
	client, server := sessions(t, c, s, Config{}, Config{DeadAfter: 500 * time.Millisecond})
	parkByPings(t, []*Session{client}, []*Session{server})
	select { // the client pings no more
	case <-server.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a parked session with a silent peer did not time out")
	}
	if err := server.Err(); err != ErrTimeout {
		t.Fatalf("error %v, want %v", err, ErrTimeout)
	}
	select { // and the client, parked, sees the end
	case <-client.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the parked peer did not see the end")
	}
}

// TestPeerHangsUpWhileParked: a parked session whose peer closes the
// connection, or half-closes it, wakes and ends.
func TestPeerHangsUpWhileParked(t *testing.T) {
	quickIdle(t)
	for _, half := range []bool{false, true} {
		c, s := tcpPair(t)
		client, server := sessions(t, c, s, Config{}, Config{})
		parkByPings(t, []*Session{client}, []*Session{server})
		if half {
			c.(*net.TCPConn).CloseWrite()
		} else {
			c.Close() // under the parked client, which Close still ends
		}
		select {
		case <-server.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("half-close %v: the parked session did not end", half)
		}
		client.Close()
	}
}

// TestParkedSessionsAfterDescriptorReuse: sessions closed while parked
// give their descriptors' numbers to new sockets, whose sessions park and
// wake as their own, and the ended ones stay ended.
func TestParkedSessionsAfterDescriptorReuse(t *testing.T) {
	quickIdle(t)
	const rounds, pairs = 3, 20
	var ends atomic.Int32
	for round := range rounds {
		var clients, servers []*Session
		for range pairs {
			c, s := tcpPair(t)
			client, server := sessions(t, c, s, Config{}, Config{})
			client.AfterFunc(func() { ends.Add(1) })
			server.AfterFunc(func() { ends.Add(1) })
			clients = append(clients, client)
			servers = append(servers, server)
		}
		parkByPings(t, clients, servers)
		for i, client := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := client.Ping(ctx)
			cancel()
			if err != nil {
				t.Fatalf("round %d, ping %d: %v", round, i, err)
			}
		}
		for i := range clients {
			clients[i].Close()
			servers[i].Close()
		}
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := ends.Load(); n != 2*rounds*pairs {
			return fmt.Errorf("%d ends ran, want %d", n, 2*rounds*pairs)
		}
		return nil
	})
}

// TestCloseRacesTheWake: a parked session closed as bytes wake it ends
// once, whichever of the two comes first, and Close returns.
func TestCloseRacesTheWake(t *testing.T) {
	quickIdle(t)
	const pairs = 50
	var ends atomic.Int32
	for i := range pairs {
		c, s := tcpPair(t)
		client, server := sessions(t, c, s, Config{}, Config{})
		server.AfterFunc(func() { ends.Add(1) })
		parkByPings(t, []*Session{client}, []*Session{server})
		pinged := make(chan struct{})
		go func() {
			defer close(pinged)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			client.Ping(ctx) // answered or not: the server is closing
		}()
		if i%2 == 0 {
			runtime.Gosched()
		}
		server.Close()
		<-pinged
		client.Close()
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := ends.Load(); n != pairs {
			return fmt.Errorf("%d ends ran, want %d", n, pairs)
		}
		return nil
	})
}

// TestQuietSessionsParkWithoutBytes: a session parks once it has carried
// no stream for handOffAfter, though its peer sends nothing after that (an
// agent that pings every 25 s): both ends of new sessions, and of sessions
// whose one stream has ended.
func TestQuietSessionsParkWithoutBytes(t *testing.T) {
	quickIdle(t)
	var all []*Session
	for range 20 {
		c, s := tcpPair(t)
		client, server := sessions(t, c, s, Config{}, Config{})
		all = append(all, client, server)
	}
	waitParked(t, all...)

	client, server := all[0], all[1]
	st, err := client.Open(context.Background(), []byte("svc"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("ask")); err != nil {
		t.Fatal(err)
	}
	peer := accept(t, server)
	if _, err := io.ReadFull(peer, make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	st.Close()
	waitParked(t, client, server)
}

// TestCutWaitForIdlenessLosesNothing: the deadline that cuts a new
// session's wait for idleness may fall while the reader waits for the rest
// of a large frame, read outside the reader's buffer; the read goes on and
// the frame arrives whole.
func TestCutWaitForIdlenessLosesNothing(t *testing.T) {
	d := handOffAfter
	t.Cleanup(func() { handOffAfter = d })
	handOffAfter = 300 * time.Millisecond // well after the frame's first half is sent
	c, s := tcpPair(t)
	defer c.Close()
	server := New(s, Config{})
	defer server.Close()
	kicking := func(want bool) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, func() error {
			if server.raw.kicking.Load() != want {
				return fmt.Errorf("the wait for idleness is cut: %v, want %v", !want, want)
			}
			return nil
		})
	}
	kicking(true) // the reader waits, to be cut 300 ms after the session began

	meta := []byte("svc")
	payload := make([]byte, 2*largePayload)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	var hdr [headerLen]byte
	header{typ: typeOpen, stream: 1, value: uint32(len(meta))}.encode(&hdr)
	first := append(hdr[:], meta...)
	header{typ: typeData, stream: 1, value: uint32(len(payload))}.encode(&hdr)
	first = append(append(first, hdr[:]...), payload[:len(payload)/2]...)
	if _, err := c.Write(first); err != nil {
		t.Fatal(err)
	}
	kicking(false) // cut while the reader waits for the frame's rest
	if _, err := c.Write(payload[len(payload)/2:]); err != nil {
		t.Fatal(err)
	}
	st := accept(t, server)
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(st, got); err != nil {
		t.Fatalf("reading the frame: %v (session: %v)", err, server.Err())
	}
	if string(got) != string(payload) {
		t.Fatal("the frame arrived changed")
	}
	if err := server.Err(); err != nil {
		t.Fatalf("the session ended: %v", err)
	}
}
