package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// echoServer accepts connections on loopback and echoes each until the peer
// half-closes, then half-closes its own side.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().String()
}

// startForwarder runs serveForward in this process and returns its address
// and a function that stops it and returns its error.
func startForwarder(t *testing.T, to string) (string, func() error) {
	t.Helper()
	addr, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serveForward(ctx, []string{"-" + forwardFlag, addr, "-to", to}, io.Discard)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("forwarder never listened: %v", err)
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("forwarder exited: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return addr, func() error { cancel(); return <-done }
}

func TestFloorForwardsBothWaysAndHalfCloses(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs last, after the echo server closes
	echo := echoServer(t)
	back, stopBack := startForwarder(t, echo)
	front, stopFront := startForwarder(t, back)

	c, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	want := bytes.Repeat([]byte("switchboard "), 20000) // 240 KB: several buffers
	go func() {
		c.Write(want)
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c) // ends only if the half-close went through both hops and back
	if err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("echo: got %d bytes, want %d equal bytes", len(got), len(want))
	}

	// A connection still open when the forwarders stop is cut, and they
	// return without error.
	idle, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	idle.Write([]byte("x"))
	buf := make([]byte, 1)
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(idle, buf); err != nil {
		t.Fatalf("the open connection's echo: %v", err)
	}
	if err := stopFront(); err != nil {
		t.Fatalf("front forwarder: %v", err)
	}
	if err := stopBack(); err != nil {
		t.Fatalf("back forwarder: %v", err)
	}
	if _, err := idle.Read(buf); err == nil {
		t.Fatal("the open connection survived its forwarder")
	}
}

func TestFloorRefusesAddressesOffLoopback(t *testing.T) {
	err := serveForward(context.Background(), []string{"-" + forwardFlag, "0.0.0.0:0", "-to", "127.0.0.1:1"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not a loopback IP address") {
		t.Fatalf("err = %v, want a loopback complaint", err)
	}
}
