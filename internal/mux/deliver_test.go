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

// carried is a wrapper of a stream that passes its bytes on unchanged and
// says so (a Carrier), as the relay's wrappers of a tunnel's stream do.
type carried struct {
	net.Conn
	st *Stream
}

func (c carried) CarriedStream() *Stream { return c.st }

// A message that arrives on one session's stream while its copy to
// another session's stream waits goes out on the other session's
// connection from the first session's reading goroutine, without waking
// the copy, through a Carrier as through the stream itself.
func TestReadingGoroutineDeliversToAnotherSessionsStream(t *testing.T) {
	for _, name := range []string{"stream", "carrier"} {
		t.Run(name, func(t *testing.T) {
			userSide, relayIn := tcpSessions(t)
			relayOut, agentSide := tcpSessions(t)
			user, in := streamPair(t, userSide, relayIn)
			out, agent := streamPair(t, relayOut, agentSide)
			var dst io.Writer = out
			if name == "carrier" {
				dst = carried{Conn: hidden{out}, st: out}
			}
			type result struct {
				n   int64
				err error
			}
			copied := make(chan result, 1)
			go func() {
				n, err := in.WriteTo(dst)
				copied <- result{n, err}
			}()
			msg := []byte("a TCP service's small message")
			buf := make([]byte, len(msg))
			for i := 1; i <= 20; i++ {
				eventually(t, func() bool { _, idle := sunkBytes(in); return idle })
				if _, err := user.Write(msg); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(agent, buf); err != nil || !bytes.Equal(buf, msg) {
					t.Fatalf("message %d: read %q, %v", i, buf, err)
				}
				eventually(t, func() bool { sunk, idle := sunkBytes(in); return idle && sunk == i*len(msg) })
			}
			user.CloseWrite()
			if r := <-copied; r.err != nil || r.n != int64(20*len(msg)) {
				t.Fatalf("WriteTo counted %d bytes, want %d; %v", r.n, 20*len(msg), r.err)
			}
		})
	}
}

// Writes of every size, from one session's stream to another's whose
// reader is slow (so that credit runs out and the copy takes over), arrive
// whole and in order; the two sessions' connections see no broken frame.
func TestDeliveryToAnotherSessionKeepsOrder(t *testing.T) {
	userSide, relayIn := tcpSessions(t)
	relayOut, agentSide := tcpSessions(t)
	user, in := streamPair(t, userSide, relayIn)
	out, agent := streamPair(t, relayOut, agentSide)
	data := make([]byte, 3*InitialWindow+54321)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	copied := make(chan int64, 1)
	wg.Go(func() {
		n, err := in.WriteTo(out)
		if err != nil {
			t.Errorf("WriteTo: %v", err)
		}
		out.CloseWrite()
		copied <- n
	})
	// Other streams of the outgoing session write meanwhile, so that the
	// direct writes meet a busy writer too.
	other, otherPeer := streamPair(t, relayOut, agentSide)
	wg.Go(func() { io.Copy(io.Discard, otherPeer) })
	wg.Go(func() {
		defer other.CloseWrite()
		b := make([]byte, 700)
		for range 300 {
			if _, err := other.Write(b); err != nil {
				return
			}
		}
	})
	wg.Go(func() {
		for w := data; len(w) > 0; {
			n := min(len(w), 1+rng.IntN(5000))
			if _, err := user.Write(w[:n]); err != nil {
				t.Errorf("Write: %v", err)
				return
			}
			w = w[n:]
		}
		user.CloseWrite()
	})
	// Read only once the outgoing stream's credit is spent: a window
	// waits in the incoming stream for the copy.
	eventually(t, func() bool {
		out.mu.Lock()
		defer out.mu.Unlock()
		return out.credit == 0
	})
	got := make([]byte, 0, len(data))
	buf := make([]byte, 1000)
	for {
		n, err := agent.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes of %d (equal: %v)", len(got), len(data), bytes.Equal(got, data))
	}
	if n := <-copied; n != int64(len(data)) {
		t.Fatalf("WriteTo counted %d bytes, want %d", n, len(data))
	}
}

// A direct write that the socket takes only in part leaves the rest of
// its frame at the head of the queue: the frames on the connection stay
// whole and in order, the direct ones and those sent as usual alike.
func TestDirectWriteLeavesTheRestFirst(t *testing.T) {
	c, s := tcpPair(t)
	c.(*net.TCPConn).SetWriteBuffer(16 << 10)
	s.(*net.TCPConn).SetReadBuffer(64 << 10)
	sess := New(c, Config{Client: true})
	defer sess.Close()
	const frames = 200
	payload := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 6000+i) }
	partial := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		left := false
		for i := range frames {
			p := payload(i)
			f := frame(header{typ: typeData, stream: 1, value: uint32(len(p))}, p)
			if !sess.w.tryWrite(f) {
				if err := sess.w.send(f); err != nil {
					t.Errorf("frame %d: %v", i, err)
					return
				}
				continue
			}
			sess.w.mu.Lock()
			rest := len(sess.w.queue) > 0 && sess.w.queue[0].rest
			sess.w.mu.Unlock()
			if rest && !left {
				left = true
				close(partial)
			}
		}
		if !left {
			t.Error("no direct write met a full socket")
			close(partial)
		}
	})
	<-partial
	var got []byte
	buf := make([]byte, 64<<10)
	for next := 0; next < frames; {
		n, err := s.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		for len(got) >= headerLen {
			h, err := parseHeader(got)
			if err != nil {
				t.Fatalf("frame %d: %v", next, err)
			}
			if len(got) < headerLen+h.payloadLen() {
				break
			}
			if h.typ == typeData && h.stream == 1 {
				if !bytes.Equal(got[headerLen:headerLen+h.payloadLen()], payload(next)) {
					t.Fatalf("frame %d: a payload of %d bytes is not the one written", next, h.payloadLen())
				}
				next++
			}
			got = got[headerLen+h.payloadLen():]
		}
	}
}
