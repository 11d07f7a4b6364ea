package mux

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// rawReader reads a socket with its own system calls, so that an idle
// session holds no read buffer: it takes one when the socket has bytes,
// and gives it back when a read would wait (unless it holds part of a
// frame). The buffer it takes is as large as its reads have needed: 4 KiB
// for the pings of an idle session, so that ten thousand sessions woken
// at once take little, up to readBufSize while reads fill it.
type rawReader struct {
	raw     syscall.RawConn
	fn      func(fd uintptr) bool
	sizes   readSize
	sawRead func(n int, err error) // tells the connection's wrappers of each read; nil if none
	// idle, if set, is asked when a read would wait holding no buffer:
	// true makes the read return errIdle, and the reader parks the session
	// (see park_linux.go), or, if it cannot (noPark), waits in a fresh
	// goroutine after this one read something (see Session.readLoop).
	// Otherwise it says how long until the session is idle if nothing
	// happens (0: not by time alone), and the wait is cut then (kick), so
	// that a session that falls quiet parks then, not at the next bytes
	// its peer sends, which for an agent that pings every 25 s is a long
	// wait with a goroutine's stack held.
	idle   func() (bool, time.Duration)
	read1  bool // this goroutine has read something
	noPark bool // parking failed: wait in the runtime's poller

	// conn is the socket, whose read deadline cuts a wait for idleness;
	// kicking, that the deadline is set for it (an atomic for the tests:
	// only the reader touches it). The session owns the socket's read
	// deadline.
	conn    net.Conn
	kicking atomic.Bool

	// Parking's, guarded by parking.mu: the socket is registered with the
	// epoll instance (perhaps disabled by its last event), under which
	// number, and whether the session ended (no park after that).
	registered bool
	closed     bool
	parkID     uint64

	// The read in progress: the buffer (nil: none held), where to read
	// into it, and the outcome.
	buf []byte
	w   int
	n   int
	err error
}

func newRawReader(c net.Conn, sawRead func(n int, err error)) *rawReader {
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
	r := &rawReader{raw: raw, sawRead: sawRead, conn: c}
	r.fn = r.attempt
	return r
}

// attempt is one read; false means the socket has nothing: wait.
func (r *rawReader) attempt(fd uintptr) bool {
	if r.buf == nil {
		r.buf = getChunk(r.sizes.size())
	}
	for {
		n, err := sysRead(int(fd), r.buf[r.w:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			if r.w == 0 {
				putChunk(r.buf) // hold no buffer while the connection is idle
				r.buf = nil
				if r.idle != nil && (r.read1 || !r.noPark) {
					idle, in := r.idle()
					if idle {
						r.unkick()
						r.n, r.err = 0, errIdle
						return true
					}
					r.kick(in)
				}
			}
			return false
		case err != nil:
			r.n, r.err = 0, os.NewSyscallError("read", err)
		case n == 0:
			r.n, r.err = 0, io.EOF
		default:
			r.n, r.err = n, nil
			r.read1 = true
			if r.w == 0 {
				r.sizes.saw(n)
			}
		}
		if r.sawRead != nil {
			r.sawRead(r.n, r.err)
		}
		return true
	}
}

// begin starts the reads of a goroutine: its first read waits.
func (r *rawReader) begin() { r.read1 = false }

// kick cuts the wait about to begin after in (none if in is 0, or one is
// set already: the session's idleness is asked again when it ends).
func (r *rawReader) kick(in time.Duration) {
	if in <= 0 || r.kicking.Load() {
		return
	}
	if r.conn.SetReadDeadline(time.Now().Add(in)) == nil {
		r.kicking.Store(true)
	}
}

func (r *rawReader) unkick() {
	if r.kicking.Load() {
		r.kicking.Store(false)
		r.conn.SetReadDeadline(time.Time{})
	}
}

// kicked reports whether err is the end of a wait that kick cut, and
// clears the deadline: the read is to be tried again.
func (r *rawReader) kicked(err error) bool {
	if !r.kicking.Load() || !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	r.unkick()
	return true
}

// read reads into buf[w:], taking a buffer first if buf is nil. It
// returns the buffer it holds after the read (nil if none) and the bytes
// read. A buffer smaller than the reads now ask for is swapped for a
// larger one first, and one that the bytes kept for a frame fill (w ==
// len(buf)) for one of readBufSize, which holds any frame the session
// waits to read whole.
func (r *rawReader) read(buf []byte, w int) ([]byte, int, error) {
	if buf != nil {
		want := r.sizes.size() // reads grew it since buf was taken
		if w == len(buf) {
			want = readBufSize
		}
		if len(buf) < want {
			bigger := getChunk(want)
			copy(bigger, buf[:w])
			putChunk(buf)
			buf = bigger
		}
	}
	r.buf, r.w, r.n, r.err = buf, w, 0, nil
	for {
		err := r.raw.Read(r.fn)
		if err == nil {
			return r.buf, r.n, r.err
		}
		if r.kicked(err) {
			continue // the attempt asks whether the session is idle now
		}
		if r.sawRead != nil {
			r.sawRead(0, err)
		}
		return r.buf, 0, err
	}
}

// idleSocket reads a socket that a copy waits on (see Copy) with its own
// system calls, so that the copy holds no buffer while the socket is
// idle: a buffer is taken when the socket is readable and given back by
// the copy once its bytes are written.
type idleSocket struct {
	raw   syscall.RawConn
	sizes *readSize // the size of the buffers it reads into
	fn    func(fd uintptr) bool

	// The read in progress: the buffer read into, and the outcome.
	buf []byte
	n   int
	err error
}

// newIdleSocket returns a reader of src's socket, or nil if src has none:
// src is a syscall.Conn (a *net.TCPConn, or the wrapper of one that
// net.TCPConn's WriteTo hands to io.Copy). Its reads take buffers of the
// sizes sizes says, and tell it what they read.
func newIdleSocket(src io.Reader, sizes *readSize) *idleSocket {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &idleSocket{raw: raw, sizes: sizes}
	s.fn = s.attempt
	return s
}

// attempt is one read; false means the socket has nothing: wait.
func (s *idleSocket) attempt(fd uintptr) bool {
	buf := getChunk(s.sizes.size())
	for {
		n, err := sysRead(int(fd), buf)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			putChunk(buf) // hold nothing while the socket is idle
			return false
		case err != nil:
			putChunk(buf)
			s.err = os.NewSyscallError("read", err)
		case n == 0:
			putChunk(buf)
			s.err = io.EOF
		default:
			s.buf, s.n = buf, n
			s.sizes.saw(n)
		}
		return true
	}
}

// read waits for the socket's bytes and returns the pooled buffer they
// were read into (nil if none), their count, and io.EOF at the end. The
// socket's read deadline holds, as for its Read.
func (s *idleSocket) read() ([]byte, int, error) {
	s.buf, s.n, s.err = nil, 0, nil
	if err := s.raw.Read(s.fn); err != nil {
		return nil, 0, err
	}
	return s.buf, s.n, s.err
}

// WaitingConn returns c, a socket, with empty reads that wait until c has
// bytes to read (or its end) and read nothing: a Copy from something that
// wraps c and passes empty reads on (the body of an upgraded HTTP/1
// connection, once its read buffer is drained) so waits holding no
// buffer. A connection that is not a socket is returned as it is.
func WaitingConn(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	w := &waitingConn{Conn: c, raw: raw}
	w.fn = w.peek
	return w
}

type waitingConn struct {
	net.Conn
	raw syscall.RawConn
	fn  func(fd uintptr) bool
	one [1]byte // what a peek reads into; reads are not concurrent
}

func (c *waitingConn) Read(p []byte) (int, error) {
	if len(p) > 0 {
		return c.Conn.Read(p)
	}
	if err := c.raw.Read(c.fn); err != nil {
		return 0, err
	}
	return 0, nil // the next read finds the bytes, the end or the error
}

// peek reports whether the socket has something for a read: bytes, its
// end or an error.
func (c *waitingConn) peek(fd uintptr) bool {
	for {
		_, _, err := syscall.Recvfrom(int(fd), c.one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch err {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		return true
	}
}

// sink is a socket a stream's copy writes to (see WriteTo), which the
// session's reading goroutine may write the stream's bytes to itself
// while the copy waits with nothing to write: a message then reaches the
// socket without waking the copy's goroutine. Its writes never wait: what
// the socket does not take at once is left to the copy.
type sink struct {
	raw syscall.RawConn
	fn  func(fd uintptr) bool

	// The write in progress: the bytes, and how many were written; or for
	// tryBuffers, the buffers left and the vector passed to writev.
	p    []byte
	n    int
	bufs net.Buffers
	iov  []syscall.Iovec
	fnv  func(fd uintptr) bool
}

// newSink returns a sink for w, or nil if w is not one of the net
// package's sockets.
func newSink(w io.Writer) *sink {
	if !kernelSocket(w) {
		return nil
	}
	raw, err := w.(syscall.Conn).SyscallConn()
	if err != nil {
		return nil
	}
	s := &sink{raw: raw}
	s.fn = s.attempt
	s.fnv = s.attemptBuffers
	return s
}

// maxIovecs bounds one writev's vector (the kernel's IOV_MAX).
const maxIovecs = 1024

// tryBuffers writes as much of bufs as the socket takes without waiting,
// with writev, and returns what is left, for a write that may wait.
func (s *sink) tryBuffers(bufs net.Buffers) net.Buffers {
	s.bufs = bufs
	s.raw.Write(s.fnv)
	rest := s.bufs
	s.bufs = nil
	return rest
}

func (s *sink) attemptBuffers(fd uintptr) bool {
	for len(s.bufs) > 0 {
		s.iov = s.iov[:0]
		for _, b := range s.bufs {
			if len(s.iov) == maxIovecs {
				break
			}
			if len(b) > 0 {
				v := syscall.Iovec{Base: &b[0]}
				v.SetLen(len(b))
				s.iov = append(s.iov, v)
			}
		}
		if len(s.iov) == 0 {
			s.bufs = nil
			break
		}
		n, err := sysWritev(int(fd), s.iov)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		consume(&s.bufs, n)
	}
	clear(s.iov[:cap(s.iov)]) // hold no pointer to the buffers
	return true
}

// consume drops the first n bytes of *bufs.
func consume(bufs *net.Buffers, n int) {
	for len(*bufs) > 0 && n >= len((*bufs)[0]) {
		n -= len((*bufs)[0])
		(*bufs)[0] = nil
		*bufs = (*bufs)[1:]
	}
	if n > 0 {
		(*bufs)[0] = (*bufs)[0][n:]
	}
}

// try writes as much of p as the socket takes without waiting and returns
// how much that was. An error (the socket's write deadline passed, the
// socket is closed or broken) writes nothing more: the copy's own write
// meets it.
func (s *sink) try(p []byte) int {
	s.p, s.n = p, 0
	s.raw.Write(s.fn)
	s.p = nil
	return s.n
}

// attempt writes until the socket would wait; it never asks to wait.
func (s *sink) attempt(fd uintptr) bool {
	for s.n < len(s.p) {
		n, err := sysWrite(int(fd), s.p[s.n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		s.n += n
	}
	return true
}
