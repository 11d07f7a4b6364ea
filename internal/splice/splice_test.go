package splice

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c, <-ch
}

// A client that half-closes after its request still gets the whole
// answer, through the splice.
func TestHalfCloseCarriesThrough(t *testing.T) {
	client, front := tcpPair(t)
	back, server := tcpPair(t)
	res := make(chan Result, 1)
	go func() { res <- Join(front, back) }()

	request := make([]byte, 1<<20)
	rand.Read(request)
	go func() {
		got, _ := io.ReadAll(server) // until the client's FIN arrives through the splice
		server.Write(bytes.Repeat([]byte{1}, len(got)/2))
		server.(*net.TCPConn).CloseWrite()
	}()
	client.Write(request)
	client.(*net.TCPConn).CloseWrite()
	answer, err := io.ReadAll(client)
	if err != nil || len(answer) != len(request)/2 {
		t.Fatalf("answer of %d bytes, %v", len(answer), err)
	}
	r := <-res
	if r.Err != nil || r.AToB != int64(len(request)) || r.BToA != int64(len(request)/2) {
		t.Fatalf("result %+v", r)
	}
	client.Close()
	server.Close()
}

// A side that fails ends the other at once.
func TestResetEndsBoth(t *testing.T) {
	client, front := tcpPair(t)
	back, server := tcpPair(t)
	res := make(chan Result, 1)
	go func() { res <- Join(front, back) }()
	client.Write([]byte("x"))
	buf := make([]byte, 1)
	io.ReadFull(server, buf)
	server.(*net.TCPConn).SetLinger(0)
	server.Close() // a reset: the splice's write or read on back fails
	client.Write([]byte("y"))
	if _, err := io.ReadAll(client); err != nil {
		t.Logf("client read ended with %v", err)
	}
	<-res
	client.Close()
}

// muxPair returns the two ends of one stream over a TCP connection.
func muxPair(t *testing.T) (*mux.Stream, *mux.Session, *mux.Session) {
	c, s := tcpPair(t)
	client, server := mux.New(c, mux.Config{Client: true}), mux.New(s, mux.Config{})
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	st, err := client.Open(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return st, client, server
}

// wrapped hides a stream's WriteTo and ReadFrom, as the wrappers of
// streams that callers join (connect's, the ports') do.
type wrapped struct{ net.Conn }

// Idle joins of sockets with tunnel streams hold no copy buffer, whether
// the stream is joined as it is or behind a wrapper.
func TestIdleJoinsHoldNoBuffer(t *testing.T) {
	const joins = 64
	_, client, server := muxPair(t)
	heap := func() int64 {
		runtime.GC()
		runtime.GC() // a pool's buffers survive one collection
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	base := heap()
	var users []net.Conn
	var wg sync.WaitGroup
	for i := range joins {
		user, front := tcpPair(t)
		st, err := client.Open(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var side io.ReadWriteCloser = st
		if i%2 == 1 {
			side = wrapped{st}
		}
		wg.Go(func() { Join(front, side) })
		st.Write([]byte{0}) // opens it
		peer, err := server.Accept()
		if err != nil {
			t.Fatal(err)
		}
		io.ReadFull(peer, make([]byte, 1))
		wg.Go(func() { io.Copy(peer, peer); peer.Close() }) // an echo
		users = append(users, user)
	}
	for i, u := range users {
		msg := []byte("hello")
		u.Write(msg)
		if _, err := io.ReadFull(u, msg); err != nil || string(msg) != "hello" {
			t.Fatalf("echo %d: %q, %v", i, msg, err)
		}
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if per := (heap() - base) / joins; per > 8<<10 {
			return fmt.Errorf("%d bytes of heap per idle join, want under 8 KiB", per)
		}
		return nil
	})
	for _, u := range users {
		u.Close()
	}
	wg.Wait()
}
