package mux

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// sunkBytes reports what the reading goroutine wrote to st's socket
// that the copy has not counted, and whether the copy waits idle.
func sunkBytes(st *Stream) (int, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.sunk, st.sinkIdle
}

// A message that arrives while a copy to a socket waits with nothing to
// write reaches the socket from the session's reading goroutine: the
// copy is not woken for it, and still counts it at the end.
func TestReadingGoroutineDeliversToAWaitingSocket(t *testing.T) {
	client, server := tcpSessions(t)
	st, peer := streamPair(t, client, server)
	user, front := tcpPair(t)
	defer user.Close()
	defer front.Close()
	type result struct {
		n   int64
		err error
	}
	copied := make(chan result, 1)
	go func() {
		n, err := peer.WriteTo(front)
		copied <- result{n, err}
	}()
	defer func() { peer.Close(); <-copied }()
	msg := []byte("a websocket's small message")
	buf := make([]byte, len(msg))
	for i := 1; i <= 20; i++ {
		eventually(t, func() bool { _, idle := sunkBytes(peer); return idle })
		if _, err := st.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(user, buf); err != nil || !bytes.Equal(buf, msg) {
			t.Fatalf("message %d: read %q, %v", i, buf, err)
		}
		// The copy, not woken, still waits; the reading goroutine counts
		// what it wrote just after writing it.
		eventually(t, func() bool { sunk, idle := sunkBytes(peer); return idle && sunk == i*len(msg) })
	}
	st.CloseWrite()
	if r := <-copied; r.err != nil || r.n != int64(20*len(msg)) {
		t.Fatalf("WriteTo counted %d bytes, want %d; %v", r.n, 20*len(msg), r.err)
	}
	copied <- result{}
}

// What a full socket does not take at once is left to the copy, in
// order, and the peer's credit stays exact: several windows of random
// writes go through a socket with small buffers that is not read until
// it is full.
func TestDeliveryToAFullSocketKeepsOrder(t *testing.T) {
	client, server := tcpSessions(t)
	st, peer := streamPair(t, client, server)
	user, front := tcpPair(t)
	defer user.Close()
	defer front.Close()
	front.(*net.TCPConn).SetWriteBuffer(32 << 10)
	user.(*net.TCPConn).SetReadBuffer(32 << 10)
	data := make([]byte, 3*InitialWindow+12345)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	copied := make(chan int64, 1)
	wg.Go(func() {
		n, err := peer.WriteTo(front)
		if err != nil {
			t.Errorf("WriteTo: %v", err)
		}
		front.(*net.TCPConn).CloseWrite()
		copied <- n
	})
	wg.Go(func() {
		for w := data; len(w) > 0; {
			n := min(len(w), 1+rng.IntN(3000))
			if _, err := st.Write(w[:n]); err != nil {
				t.Errorf("Write: %v", err)
				return
			}
			w = w[n:]
		}
		st.CloseWrite()
	})
	// Read only once the socket is full and the writer has spent its
	// credit: a window waits for the copy.
	eventually(t, func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.credit == 0
	})
	got, err := io.ReadAll(user)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the socket read %d bytes of %d (equal: %v), %v", len(got), len(data), bytes.Equal(got, data), err)
	}
	if n := <-copied; n != int64(len(data)) {
		t.Fatalf("WriteTo counted %d bytes, want %d", n, len(data))
	}
}
