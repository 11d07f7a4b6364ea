package splice

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"

	"go.uber.org/goleak"
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
