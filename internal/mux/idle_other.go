//go:build !linux

package mux

import "net"

// rawReader is Linux-only; elsewhere a session reads through the net.Conn
// and keeps its read buffer.
type rawReader struct{}

func newRawReader(net.Conn) *rawReader { return nil }

func (*rawReader) read(buf []byte, w int) ([]byte, int, error) { panic("unreachable") }
