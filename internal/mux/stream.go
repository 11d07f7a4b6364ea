package mux

import (
	"cmp"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Stream is one stream of a session: a net.Conn with half-close. Reads
// and writes may run concurrently with each other; like a net.Conn's,
// concurrent reads (or writes) interleave.
type Stream struct {
	s    *Session
	id   uint32
	meta []byte

	rdl, wdl deadline
	readable chan struct{} // signalled when there is something new to read
	writable chan struct{} // signalled when there is new credit

	mu       sync.Mutex // guards the fields below
	open     []byte     // the OPEN frame's metadata, until it is sent with the stream's first frame
	opening  bool       // the OPEN frame is not sent yet
	chunks   [][]byte   // received and unread; the first from roff
	roff     int
	buffered int   // unread bytes
	granted  int64 // receive credit ever granted to the peer
	recvd    int64 // bytes ever received
	read     int64 // bytes ever read
	credit   int64 // bytes this end may still send
	rfin     bool  // the peer writes no more
	wfin     bool  // this end writes no more (its FIN is sent or on its way)
	closed   bool  // Close was called
	err      error // the stream was reset, or the session ended

	// Direct delivery (see deliverLocked): the socket or stream the
	// stream's copy writes to, whether the copy waits for bytes with
	// nothing to write, whether the reading goroutine is writing to the
	// sink, and the bytes it wrote that the copy has not counted yet.
	sink     deliverer
	sinkIdle bool
	sinking  bool
	sunk     int
}

func newStream(s *Session, id uint32, meta []byte) *Stream {
	return &Stream{
		s: s, id: id, meta: meta,
		rdl: newDeadline(), wdl: newDeadline(),
		readable: make(chan struct{}, 1),
		writable: make(chan struct{}, 1),
		granted:  InitialWindow,
		credit:   InitialWindow,
	}
}

// ID returns the stream's id, unique within its session.
func (st *Stream) ID() uint32 { return st.id }

// Meta returns the metadata the opener sent with the stream.
func (st *Stream) Meta() []byte { return st.meta }

// Session returns the session the stream belongs to.
func (st *Stream) Session() *Session { return st.s }

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Read reads what the peer wrote. It returns io.EOF after the peer's
// CloseWrite (or Close) once every byte is read; a *ResetError if the
// stream was reset before that. A Read with an empty p waits until there
// is something to read (or the stream ends) and consumes nothing: a copy
// can wait for the peer without holding a buffer (see Copy).
func (st *Stream) Read(p []byte) (int, error) {
	if err := st.flushOpen(); err != nil {
		return 0, err
	}
	if isClosed(st.rdl.wait()) {
		return 0, os.ErrDeadlineExceeded
	}
	st.mu.Lock()
	if err := st.waitReadableLocked(); err != nil {
		st.mu.Unlock()
		return 0, err
	}
	n := 0
	for n < len(p) && len(st.chunks) > 0 {
		c := st.chunks[0][st.roff:]
		k := copy(p[n:], c)
		n += k
		st.roff += k
		if k == len(c) {
			st.popChunkLocked()
		}
	}
	st.buffered -= n
	inc := st.consumedLocked(n)
	st.mu.Unlock()
	st.grant(inc)
	return n, nil
}

// waitReadableLocked waits until there are unread bytes, or returns why
// there will be none.
func (st *Stream) waitReadableLocked() error {
	for st.buffered == 0 {
		switch {
		case st.closed:
			return net.ErrClosed
		case st.rfin:
			return io.EOF
		case st.err != nil:
			return st.err
		}
		expired := st.rdl.wait()
		st.mu.Unlock()
		select {
		case <-st.readable:
			st.mu.Lock()
		case <-expired:
			st.mu.Lock()
			if st.buffered == 0 {
				return os.ErrDeadlineExceeded
			}
		}
	}
	return nil
}

func (st *Stream) popChunkLocked() {
	putChunk(st.chunks[0])
	st.chunks[0] = nil
	st.chunks = st.chunks[1:]
	st.roff = 0
	if len(st.chunks) == 0 {
		st.chunks = nil
	}
}

// consumedLocked counts n bytes read (taken off st.buffered by the
// caller) and returns the credit to grant the peer now, if any: the window
// is topped up once a quarter of it is used. Topping up at a half would
// let a sender whose credit runs out (one on a long link, sending faster
// than the link) move only half a window per round trip: it spends each
// grant at once and waits for the next, and the session's measurement of
// the link, seeing half a window per round trip, would never grow the
// window (a 100 Mbit/s × 80 ms link stuck at half its rate with a 1 MiB
// window: bench/slowlink).
func (st *Stream) consumedLocked(n int) int64 {
	st.read += int64(n)
	if st.rfin || st.err != nil || st.closed {
		return 0
	}
	window := st.s.window.Load()
	inc := st.read + window - st.granted
	if inc < window/4 {
		return 0
	}
	st.granted += inc
	return inc
}

func (st *Stream) grant(inc int64) {
	if inc > 0 {
		st.s.w.control(header{typ: typeWindow, stream: st.id, value: uint32(inc)}, nil)
	}
}

// Write writes p to the stream, waiting for credit as the peer reads.
func (st *Stream) Write(p []byte) (int, error) {
	if isClosed(st.wdl.wait()) {
		return 0, os.ErrDeadlineExceeded
	}
	written := 0
	for written < len(p) {
		n, seq, err := st.queueData(p[written:])
		if err != nil {
			return written, err
		}
		if err := st.s.w.wait(seq); err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

// queueData waits for credit, then queues DATA frames for as much of p as
// it allows (after the stream's OPEN frame, if it is not sent yet).
func (st *Stream) queueData(p []byte) (int, uint64, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for {
		switch {
		case st.closed:
			return 0, 0, net.ErrClosed
		case st.err != nil:
			return 0, 0, st.err
		case st.wfin:
			return 0, 0, errWriteAfterClose
		case st.credit > 0:
			n := int(min(int64(len(p)), st.credit))
			st.credit -= int64(n)
			var frames [8]outFrame
			fs := append(frames[:0], st.takeOpenLocked(false)...)
			for chunk := p[:n]; len(chunk) > 0; {
				k := min(len(chunk), st.s.cfg.WriteFrame)
				fs = append(fs, frame(header{typ: typeData, stream: st.id, value: uint32(k)}, chunk[:k]))
				chunk = chunk[k:]
			}
			seq, err := st.s.w.enqueue(fs...)
			return n, seq, err
		}
		expired := st.wdl.wait()
		st.mu.Unlock()
		select {
		case <-st.writable:
			st.mu.Lock()
		case <-expired:
			st.mu.Lock()
			if st.credit == 0 {
				return 0, 0, os.ErrDeadlineExceeded
			}
		}
	}
}

var errWriteAfterClose = &net.OpError{Op: "write", Net: "mux", Err: net.ErrClosed}

// takeOpenLocked returns the stream's OPEN frame if it is not sent yet.
func (st *Stream) takeOpenLocked(fin bool) []outFrame {
	if !st.opening {
		return nil
	}
	st.opening = false
	var flags uint8
	if fin {
		flags = flagFin
	}
	f := frame(header{typ: typeOpen, flags: flags, stream: st.id, value: uint32(len(st.open))}, st.open)
	st.open = nil
	return []outFrame{f}
}

// flushOpen sends the OPEN frame if nothing was written yet, before a read
// waits for the peer: a peer that speaks first must know of the stream.
func (st *Stream) flushOpen() error {
	seq, err := st.queue(func() []outFrame { return st.takeOpenLocked(false) })
	if seq == 0 || err != nil {
		return err
	}
	return st.s.w.wait(seq)
}

// queue queues the frames that frames returns, under the stream's lock.
// It returns 0 if there were none.
func (st *Stream) queue(frames func() []outFrame) (uint64, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	fs := frames()
	if len(fs) == 0 {
		return 0, nil
	}
	return st.s.w.enqueue(fs...)
}

// CloseWrite ends this end's direction: the peer reads io.EOF once it has
// read everything before. Reading goes on.
func (st *Stream) CloseWrite() error {
	var err error
	done := false
	seq, qerr := st.queue(func() []outFrame {
		if st.closed || st.err != nil || st.wfin {
			err = st.err
			if st.closed {
				err = net.ErrClosed
			}
			return nil
		}
		st.wfin = true
		done = st.rfin
		if open := st.takeOpenLocked(true); open != nil {
			return open
		}
		return []outFrame{frame(header{typ: typeData, flags: flagFin, stream: st.id}, nil)}
	})
	if err != nil || qerr != nil {
		return cmp.Or(err, qerr)
	}
	if done {
		st.s.remove(st.id)
	}
	return st.s.w.wait(seq)
}

// Close ends the stream both ways: what was written is still delivered,
// then the peer reads io.EOF; what the peer sends from then on is dropped
// and its writes fail.
func (st *Stream) Close() error {
	first := false
	seq, err := st.queue(func() []outFrame {
		if st.closed {
			return nil
		}
		first = true
		st.closed = true
		defer st.dropLocked()
		if st.opening {
			st.opening = false // the peer never heard of it
			return nil
		}
		if st.err != nil {
			return nil
		}
		var fs []outFrame
		if !st.wfin {
			st.wfin = true
			fs = append(fs, frame(header{typ: typeData, flags: flagFin, stream: st.id}, nil))
		}
		if !st.rfin {
			fs = append(fs, frame(header{typ: typeReset, stream: st.id, value: CodeClosed}, nil))
		}
		return fs
	})
	if !first {
		return nil
	}
	signal(st.readable)
	signal(st.writable)
	st.s.remove(st.id)
	if seq == 0 || err != nil {
		return err
	}
	return st.s.w.wait(seq)
}

// Reset ends the stream at once both ways with code: unread and unsent
// bytes are dropped, and the peer's reads and writes fail with a
// *ResetError.
func (st *Stream) Reset(code uint32) error {
	first := false
	_, err := st.queue(func() []outFrame {
		if st.err != nil || st.closed {
			return nil
		}
		first = true
		st.err = &ResetError{Code: code}
		st.dropLocked()
		if st.opening {
			st.opening = false // the peer never heard of it
			return nil
		}
		return []outFrame{frame(header{typ: typeReset, stream: st.id, value: code}, nil)}
	})
	if first {
		signal(st.readable)
		signal(st.writable)
		st.s.remove(st.id)
		st.s.w.kick()
	}
	return err
}

// dropLocked frees the unread chunks.
func (st *Stream) dropLocked() {
	for _, c := range st.chunks {
		putChunk(c)
	}
	st.chunks = nil
	st.roff = 0
	st.buffered = 0
}

// SetDeadline, SetReadDeadline and SetWriteDeadline are net.Conn's: a
// blocked Read or Write returns os.ErrDeadlineExceeded once t passes.
func (st *Stream) SetDeadline(t time.Time) error {
	st.rdl.set(t)
	st.wdl.set(t)
	return nil
}

func (st *Stream) SetReadDeadline(t time.Time) error  { st.rdl.set(t); return nil }
func (st *Stream) SetWriteDeadline(t time.Time) error { st.wdl.set(t); return nil }

// LocalAddr and RemoteAddr are the session connection's.
func (st *Stream) LocalAddr() net.Addr  { return st.s.conn.LocalAddr() }
func (st *Stream) RemoteAddr() net.Addr { return st.s.conn.RemoteAddr() }

// The reading goroutine's side.

// receive adds a DATA frame's payload (owned: a chunk the stream now
// owns; otherwise the read buffer's, copied if kept) and reports whether
// the peer broke the stream's credit.
func (st *Stream) receive(payload []byte, owned, fin bool) (over bool) {
	drop := func() {
		if owned && payload != nil {
			putChunk(payload)
		}
	}
	st.mu.Lock()
	n := len(payload)
	if st.closed || st.err != nil {
		st.mu.Unlock()
		drop()
		return false
	}
	st.recvd += int64(n)
	if st.recvd > st.granted || st.rfin {
		st.mu.Unlock()
		drop()
		return true
	}
	k, inc, tried := st.deliverLocked(payload)
	switch {
	case k == n:
		drop()
	case st.closed || st.err != nil: // while the lock was let go
		drop()
		fin = false
	case k > 0 && owned:
		st.chunks = append(st.chunks, payload)
		st.roff = k
		st.buffered += n - k
	case owned:
		st.chunks = append(st.chunks, payload)
		st.buffered += n
	default:
		chunk := getChunk(n - k)
		copy(chunk, payload[k:])
		st.chunks = append(st.chunks, chunk)
		st.buffered += n - k
	}
	done := false
	if fin {
		st.rfin = true
		done = st.wfin
	}
	// The copy is woken for bytes to write, for the end, or when it
	// stopped waiting during the write (see takeChunks).
	wake := st.buffered > 0 || fin || tried && !st.sinkIdle
	st.mu.Unlock()
	st.grant(inc)
	if wake {
		signal(st.readable)
	}
	if done {
		st.s.remove(st.id)
	}
	return false
}

// deliverLocked writes what of p the stream's sink takes at once, when
// the copy that writes to the sink waits with nothing to write, so that
// the bytes reach the socket, or the connection of the stream the copy
// writes to, from the reading goroutine without a wake-up of the copy's. It never waits on the socket: what is left is queued for
// the copy. It lets the lock go while it writes (the copy, woken, waits
// for the write to end: see takeChunks) and returns the bytes written,
// the credit to grant for them, and whether it tried.
func (st *Stream) deliverLocked(p []byte) (int, int64, bool) {
	if len(p) == 0 || !st.sinkIdle || st.sinking || st.buffered > 0 {
		return 0, 0, false
	}
	st.sinking = true
	st.mu.Unlock()
	k := st.sink.try(p)
	st.mu.Lock()
	st.sinking = false
	st.sunk += k
	return k, st.consumedLocked(k), true
}

func (st *Stream) addCredit(n uint32) (over bool) {
	st.mu.Lock()
	st.credit += int64(n)
	over = st.credit > maxCredit
	st.mu.Unlock()
	signal(st.writable)
	return over
}

// fail ends the stream with err (a reset, or the session's end). Unread
// bytes stay readable.
func (st *Stream) fail(err error) {
	st.mu.Lock()
	if st.err == nil {
		st.err = err
	}
	st.mu.Unlock()
	signal(st.readable)
	signal(st.writable)
}

// deliverer is where the reading goroutine delivers a stream's bytes
// while the stream's copy waits (see deliverLocked): try writes what it
// takes of p at once, without waiting, and returns how much that was.
type deliverer interface{ try(p []byte) int }

// Carrier is a connection that carries a stream under a wrapper of its
// own (one that translates the stream's errors, say) and whose Write
// passes the bytes on to the stream unchanged: a copy from another stream
// to it may write to the carried stream directly (see deliverLocked). A
// wrapper that changes the bytes must not be a Carrier.
type Carrier interface {
	CarriedStream() *Stream
}

// deliveryTo returns where the reading goroutine may deliver the bytes of
// a copy to w: w's socket, or the stream w is or carries; nil if nowhere.
func deliveryTo(w io.Writer) deliverer {
	if sk := newSink(w); sk != nil {
		return sk
	}
	switch w := w.(type) {
	case *Stream:
		return streamSink{w}
	case Carrier:
		if st := w.CarriedStream(); st != nil {
			return streamSink{st}
		}
	}
	return nil
}

// streamSink delivers to a stream on another session: see Stream.tryWrite.
type streamSink struct{ st *Stream }

func (s streamSink) try(p []byte) int { return s.st.tryWrite(p) }

// tryWrite writes p to the stream as one DATA frame on the session's
// connection, from the calling goroutine and without waiting (see
// writer.tryWrite), when the stream is open, has credit for all of p, has
// no write deadline past, and no one else writes on the connection. It
// returns len(p), or 0 having written nothing: the caller's copy then
// writes p as usual.
func (st *Stream) tryWrite(p []byte) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(p) == 0 || st.closed || st.err != nil || st.wfin || st.opening || st.credit < int64(len(p)) || len(p) > st.s.cfg.WriteFrame || isClosed(st.wdl.wait()) {
		return 0
	}
	if !st.s.w.tryWrite(frame(header{typ: typeData, stream: st.id, value: uint32(len(p))}, p)) {
		return 0
	}
	st.credit -= int64(len(p))
	return len(p)
}
