//go:build !linux

package mux

import (
	"io"
	"net"
	"time"
)

// rawReader is Linux-only; elsewhere a session reads through the net.Conn
// and keeps its read buffer.
type rawReader struct {
	idle   func() (bool, time.Duration)
	noPark bool
}

// Sessions are parked on Linux only.
func (*Session) park() bool   { return false }
func (*Session) unpark() bool { return false }

func newRawReader(net.Conn, func(int, error)) *rawReader { return nil }

func (*rawReader) begin() { panic("unreachable") }

func (*rawReader) read(buf []byte, w int) ([]byte, int, error) { panic("unreachable") }

func (*rawReader) kicked(error) bool { return false }

// idleSocket is Linux-only too; elsewhere a copy from a socket holds its
// buffer while it waits.
type idleSocket struct{}

func newIdleSocket(io.Reader, *readSize) *idleSocket { return nil }

func (*idleSocket) read() ([]byte, int, error) { panic("unreachable") }

// sink is Linux-only: elsewhere the copy writes every byte itself.
type sink struct{}

func newSink(io.Writer) *sink { return nil }

func (*sink) try([]byte) int { panic("unreachable") }

func (*sink) tryBuffers(net.Buffers) net.Buffers { panic("unreachable") }

// WaitingConn is Linux-only: elsewhere c is returned as it is, and a copy
// from what wraps it holds its buffer while it waits.
func WaitingConn(c net.Conn) net.Conn { return c }
