package mux

import (
	"io"
	"net"
	"os"
	"syscall"
)

// rawReader reads a socket with its own system calls, so that an idle
// session holds no read buffer: it takes one when the socket has bytes,
// and gives it back when a read would wait (unless it holds part of a
// frame).
type rawReader struct {
	raw syscall.RawConn
	fn  func(fd uintptr) bool

	// The read in progress: the buffer (nil: none held), where to read
	// into it, and the outcome.
	buf []byte
	w   int
	n   int
	err error
}

func newRawReader(c net.Conn) *rawReader {
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
	r := &rawReader{raw: raw}
	r.fn = r.attempt
	return r
}

// attempt is one read; false means the socket has nothing: wait.
func (r *rawReader) attempt(fd uintptr) bool {
	if r.buf == nil {
		r.buf = getChunk(readBufSize)
	}
	for {
		n, err := syscall.Read(int(fd), r.buf[r.w:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			if r.w == 0 {
				putChunk(r.buf) // hold no buffer while the connection is idle
				r.buf = nil
			}
			return false
		case err != nil:
			r.n, r.err = 0, os.NewSyscallError("read", err)
		case n == 0:
			r.n, r.err = 0, io.EOF
		default:
			r.n, r.err = n, nil
		}
		return true
	}
}

// read reads into buf[w:], taking a buffer first if buf is nil. It
// returns the buffer it holds after the read (nil if none) and the bytes
// read.
func (r *rawReader) read(buf []byte, w int) ([]byte, int, error) {
	r.buf, r.w, r.n, r.err = buf, w, 0, nil
	if err := r.raw.Read(r.fn); err != nil {
		return r.buf, 0, err
	}
	return r.buf, r.n, r.err
}
