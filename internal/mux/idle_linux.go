package mux

import (
	"net"
	"syscall"
)

// idleWaiter waits for a socket to have bytes to read without reading
// them, so that an idle session holds no read buffer.
type idleWaiter struct {
	raw   syscall.RawConn
	peek  [1]byte
	ready func(fd uintptr) bool
}

func newIdleWaiter(c net.Conn) *idleWaiter {
	var sc syscall.Conn
	switch c := c.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &idleWaiter{raw: raw}
	w.ready = func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), w.peek[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return err != syscall.EAGAIN // data, end of stream or an error: the next Read reports it
	}
	return w
}

// wait returns when the socket is readable (or closed).
func (w *idleWaiter) wait() error { return w.raw.Read(w.ready) }
