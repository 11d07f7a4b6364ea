package mux

import (
	"bytes"
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

// TestRawReaderTakesWhatReadsNeed: a session woken by a few bytes (a
// ping) reads them into a 4 KiB buffer, not one of readBufSize, so that
// many idle sessions woken at once take little; a buffer that the bytes
// kept for a frame fill grows, keeping them, and so does one smaller than
// what full reads have come to ask for.
func TestRawReaderTakesWhatReadsNeed(t *testing.T) {
	c, s := tcpPair(t)
	defer c.Close()
	defer s.Close()
	r := newRawReader(s, nil)
	if r == nil {
		t.Fatal("no raw reader for a TCP socket")
	}
	ping := []byte("twelve bytes")
	if _, err := c.Write(ping); err != nil {
		t.Fatal(err)
	}
	buf, n, err := r.read(nil, 0)
	if err != nil || n != len(ping) {
		t.Fatalf("read %d bytes, %v; want %d", n, err, len(ping))
	}
	if cap(buf) > 4<<10 {
		t.Errorf("a %d-byte read took a buffer of %d bytes, want 4 KiB", n, cap(buf))
	}

	// The ping's bytes stay, as those of a frame not yet whole would: the
	// reads after it fill the 4 KiB buffer, and the next must not be one
	// into nothing (which reads as the connection's end).
	rest := bytes.Repeat([]byte("0123456789abcdef"), 1<<10) // 16 KiB
	if _, err := c.Write(rest); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte(nil), ping...), rest...)
	w := n
	for w < len(want) {
		buf, n, err = r.read(buf, w)
		if err != nil {
			t.Fatalf("after %d bytes in a buffer of %d: %v", w, len(buf), err)
		}
		w += n
	}
	if !bytes.Equal(buf[:w], want) {
		t.Fatal("the bytes read across the buffer's growth differ from those written")
	}
	putChunk(buf)

	// Reads that fill the buffer from its start ask for larger ones.
	big := bytes.Repeat([]byte("fedcba9876543210"), 4<<10) // 64 KiB
	if _, err := c.Write(big); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(big) {
		buf, n, err = r.read(nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		putChunk(buf)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("the bytes of full reads differ from those written")
	}
	if size := r.sizes.size(); size <= 4<<10 {
		t.Errorf("after full reads of 64 KiB the reader asks for %d bytes, want more than 4 KiB", size)
	}
}

// TestSessionReadsFramesLargerThanItsBuffer: a session whose reads have
// been small (its buffer 4 KiB) receives whole frames of every size, those
// that wait in the read buffer (under largePayload) and those read into a
// chunk of their own, each arriving intact.
func TestSessionReadsFramesLargerThanItsBuffer(t *testing.T) {
	client, server := tcpSessions(t)
	if _, err := client.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := client.Open(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{1, 4<<10 - headerLen, 4 << 10, 5000, 12000, largePayload - 1, largePayload, 40000, readBufSize, 3 * readBufSize}
	var want []byte
	for i, n := range sizes {
		want = append(want, bytes.Repeat([]byte{byte('a' + i)}, n)...)
	}
	go func() {
		for i, n := range sizes {
			if _, err := st.Write(bytes.Repeat([]byte{byte('a' + i)}, n)); err != nil {
				return
			}
		}
		st.CloseWrite()
	}()
	peer := accept(t, server)
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d; they differ", len(got), len(want))
	}
	st.Close()
	peer.Close()
}

// TestIdleSessionsWaitOnSmallStacks: sessions that carry no stream wait
// for their pings in fresh goroutines, on small stacks, after their
// readers acted on frames (here a stream each, which grows a reader's
// stack, and then pings).
func TestIdleSessionsWaitOnSmallStacks(t *testing.T) {
	d := handOffAfter
	t.Cleanup(func() { handOffAfter = d }) // after the sessions' cleanups
	handOffAfter = 50 * time.Millisecond
	const pairs = 100
	limit := int64(2500) // two readers a pair; a goroutine's smallest stack is 2 KiB
	if raceEnabled {
		limit = 5 << 10
	}
	stacks := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.StackInuse)
	}
	base := stacks()
	var all []*Session
	for range pairs {
		c, s := tcpPair(t)
		ping := Config{PingAfter: 20 * time.Millisecond, DeadAfter: 5 * time.Second}
		client, server := sessions(t, c, s, ping, ping)
		st, peer := streamPair(t, client, server)
		msg := bytes.Repeat([]byte("x"), 30000)
		go func() { st.Write(msg); st.Close() }()
		if got, err := io.ReadAll(peer); err != nil || len(got) != len(msg) {
			t.Fatalf("read %d bytes, %v; want %d", len(got), err, len(msg))
		}
		peer.Close()
		all = append(all, client, server)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if per := (stacks() - base) / (2 * pairs); per > limit {
			return fmt.Errorf("%d bytes of stack per idle session, want at most %d", per, limit)
		}
		return nil
	})
	for _, s := range all {
		if err := s.Err(); err != nil {
			t.Fatalf("an idle session ended: %v", err)
		}
	}
}

// watcher is a Transparent wrapper that counts what goes through it.
type watcher struct {
	net.Conn
	reads, writes atomic.Int64 // calls of its own Read and Write
	saw           atomic.Int64 // bytes SawRead was told of
	sawErr        atomic.Bool
}

func (w *watcher) Read(p []byte) (int, error) {
	w.reads.Add(1)
	n, err := w.Conn.Read(p)
	w.SawRead(n, err)
	return n, err
}

func (w *watcher) Write(p []byte) (int, error) {
	w.writes.Add(1)
	return w.Conn.Write(p)
}

func (w *watcher) Wrapped() net.Conn { return w.Conn }

func (w *watcher) SawRead(n int, err error) {
	w.saw.Add(int64(n))
	if err != nil {
		w.sawErr.Store(true)
	}
}

// TestSessionSeesThroughTransparentWrappers: a session over wrappers of a
// socket reads and writes the socket itself, as it does a bare one, and
// tells every wrapper of each read; over wrappers of something else it
// goes through them.
func TestSessionSeesThroughTransparentWrappers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pair   func(testing.TB) (net.Conn, net.Conn)
		socket bool
	}{
		{"tcp", tcpPair, true},
		{"pipe", func(testing.TB) (net.Conn, net.Conn) { return net.Pipe() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := tc.pair(t)
			inner := &watcher{Conn: c}
			outer := &watcher{Conn: inner}
			client, server := sessions(t, outer, s, Config{}, Config{})
			if got := client.raw != nil; got != tc.socket {
				t.Fatalf("session reads the socket itself: %v, want %v", got, tc.socket)
			}
			st, err := client.Open(context.Background(), []byte("x"))
			if err != nil {
				t.Fatal(err)
			}
			payload := bytes.Repeat([]byte("y"), 3*readBufSize) // large payloads are read whole, apart
			go func() {
				peer, err := server.Accept()
				if err != nil {
					return
				}
				io.Copy(peer, peer)
				peer.Close()
			}()
			go func() {
				st.Write(payload)
				st.CloseWrite()
			}()
			got, err := io.ReadAll(st)
			if err != nil || !bytes.Equal(got, payload) {
				t.Fatalf("echo: %d bytes, %v; want %d", len(got), err, len(payload))
			}
			for _, w := range []*watcher{inner, outer} {
				if w.saw.Load() < int64(len(payload)) {
					t.Errorf("a wrapper was told of %d bytes read, want at least %d", w.saw.Load(), len(payload))
				}
			}
			if tc.socket && (outer.reads.Load() != 0 || outer.writes.Load() != 0 || inner.reads.Load() != 0 || inner.writes.Load() != 0) {
				t.Errorf("reads and writes through the wrappers: %d+%d and %d+%d, want none",
					outer.reads.Load(), outer.writes.Load(), inner.reads.Load(), inner.writes.Load())
			}
			if !tc.socket && outer.reads.Load() == 0 {
				t.Error("a wrapper of a pipe was not read through")
			}
			server.Close()
			testkit.Eventually(t, 5*time.Second, func() error {
				if !outer.sawErr.Load() || !inner.sawErr.Load() {
					return errors.New("the wrappers were not told of the failed read after the peer closed")
				}
				return nil
			})
		})
	}
}
