package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
)

// The backend's commands: the first byte a connection sends.
const (
	cmdEcho   = 'e' // echo everything back until the client closes
	cmdSource = 's' // then an 8-byte big-endian count: send that many bytes, then close
)

// serveBackend is the backend process: every connection on addr gets the
// service its first byte asks for. It runs until SIGTERM.
func serveBackend(addr string) error { return serve("backend", addr, backendConn) }

// serve hands every connection accepted on addr to handle, in a goroutine
// of its own, until SIGTERM or SIGINT.
func serve(what, addr string, handle func(net.Conn)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	go untilSignal(ln)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go handle(c)
	}
}

func backendConn(c net.Conn) {
	defer c.Close()
	var cmd [1]byte
	if _, err := io.ReadFull(c, cmd[:]); err != nil {
		return
	}
	switch cmd[0] {
	case cmdEcho:
		buf := make([]byte, 4<<10)
		io.CopyBuffer(onlyWriter{c}, onlyReader{c}, buf)
	case cmdSource:
		var n [8]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		left := int64(binary.BigEndian.Uint64(n[:]))
		buf := make([]byte, 64<<10)
		for left > 0 {
			k := min(left, int64(len(buf)))
			if _, err := c.Write(buf[:k]); err != nil {
				return
			}
			left -= k
		}
	}
}

// serveForward is a floor forwarder: every connection accepted on addr is
// joined to a new connection to to, each byte copied through a buffer in
// user space (the wrappers keep Go from splicing in the kernel), as the
// main harness's floor does.
func serveForward(addr, to string) error {
	return serve("forwarder", addr, func(c net.Conn) {
		defer c.Close()
		d, err := net.Dial("tcp", to)
		if err != nil {
			return
		}
		defer d.Close()
		done := make(chan struct{})
		go func() {
			io.CopyBuffer(onlyWriter{d}, onlyReader{c}, make([]byte, 32<<10))
			d.(*net.TCPConn).CloseWrite()
			close(done)
		}()
		io.CopyBuffer(onlyWriter{c}, onlyReader{d}, make([]byte, 32<<10))
		c.(*net.TCPConn).CloseWrite()
		<-done
	})
}

// untilSignal closes ln at SIGTERM or SIGINT.
func untilSignal(ln net.Listener) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
	ln.Close()
	os.Exit(0)
}

type onlyReader struct{ io.Reader }
type onlyWriter struct{ io.Writer }
