package mux

import (
	"io"
	"net"
	"sync/atomic"
	"time"
)

// Copies between a stream and what it is joined with (a user's socket, a
// service's connection) hold no buffer while nothing moves: WriteTo hands
// over the chunks the stream received, and ReadFrom waits for its source
// to become readable before it takes a pooled buffer, which it gives back
// once the bytes are written. An idle websocket or TCP connection joined
// to a stream so costs its goroutines' stacks and no copy buffers.

// readSize picks the size of the pooled buffer a copy reads into by what
// its reads brought: 4 KiB to begin with and for a websocket's small
// messages, up to one DATA frame (64 KiB) for a bulk transfer, so that
// ten thousand copies woken at once take small buffers, and a transfer
// takes few system calls.
type readSize struct{ class int } // an index into chunkSizes

const (
	minReadClass = 1 // 4 KiB
	maxReadClass = 3 // 64 KiB, DefaultWriteFrame
)

func (r *readSize) size() int { return chunkSizes[max(r.class, minReadClass)] }

// saw adapts the size to a read of n bytes into a buffer of size().
func (r *readSize) saw(n int) {
	size := r.size()
	switch {
	case n == size && r.class < maxReadClass:
		r.class = max(r.class, minReadClass) + 1
	case n < size/4 && r.class > minReadClass:
		r.class--
	}
}

// WriteTo writes what the peer writes to w until the peer's CloseWrite,
// handing over received chunks without a copy of its own; while the
// stream is idle it holds no buffer. Received bytes are credited to the
// peer when they are taken, so a stream holds at most twice its window:
// what it has received and what it is writing to w.
func (st *Stream) WriteTo(w io.Writer) (int64, error) {
	if err := st.flushOpen(); err != nil {
		return 0, err
	}
	return loop(st.writeStep(w))
}

// writeStep returns a step that waits for received bytes and writes them
// to w. When w is a socket, a stream or a Carrier of one, the session's
// reading goroutine writes what arrives while the step waits with nothing
// to write straight to it (see Stream.deliverLocked); the step counts
// those bytes too.
func (st *Stream) writeStep(w io.Writer) func() (int, error) {
	var spare net.Buffers // reused between writes; WriteTo consumes what it is given
	sk := deliveryTo(w)
	return func() (int, error) {
		chunks, roff, n, sunk, err := st.takeChunks(sk)
		if err != nil {
			return sunk, err
		}
		bufs := append(spare[:0], chunks...)
		spare = bufs
		bufs[0] = bufs[0][roff:]
		_, err = bufs.WriteTo(w)
		for _, c := range chunks {
			putChunk(c)
		}
		if err != nil {
			return sunk, err
		}
		return sunk + n, nil
	}
}

// takeChunks waits for received bytes and takes them all, crediting the
// peer: the chunks, where the first's unread bytes begin, and how many
// bytes they hold; and the bytes the reading goroutine wrote to sk (when
// not nil) while it waited.
func (st *Stream) takeChunks(sk deliverer) (chunks [][]byte, roff, n, sunk int, err error) {
	st.mu.Lock()
	st.sink, st.sinkIdle = sk, sk != nil
	err = st.waitReadableLocked()
	st.sinkIdle = false
	for st.sinking { // the reading goroutine is writing to sk: let it end first
		st.mu.Unlock()
		<-st.readable
		st.mu.Lock()
	}
	sunk, st.sunk = st.sunk, 0
	if err != nil {
		st.mu.Unlock()
		return nil, 0, 0, sunk, err
	}
	chunks, roff, n = st.chunks, st.roff, st.buffered
	st.chunks, st.roff, st.buffered = nil, 0, 0
	inc := st.consumedLocked(n)
	st.mu.Unlock()
	st.grant(inc)
	return chunks, roff, n, sunk, nil
}

// ReadFrom writes what r reads to the stream until r's end (io.EOF),
// waiting for credit as the peer reads; it does not end the stream's
// writing (that is CloseWrite's). When r is a socket — a syscall.Conn,
// such as a *net.TCPConn or the wrapper that net.TCPConn's WriteTo hands
// to io.Copy — it waits for r to become readable holding no buffer, and
// takes a pooled one only to move bytes. Otherwise see Copy.
func (st *Stream) ReadFrom(r io.Reader) (int64, error) { return loop(readStep(st, r)) }

// Copy copies src to dst until src ends, as io.Copy does, holding no copy
// buffer while src is idle wherever it can tell when src has bytes:
//   - src is a stream or a StepWriterTo: its steps;
//   - src has a WriteTo other than a kernel socket's (whose WriteTo copies
//     through a 32 KiB buffer when it cannot splice): src.WriteTo(dst);
//   - dst is a stream or a StepReaderFrom: its steps;
//   - dst has a ReadFrom other than a kernel socket's: dst.ReadFrom(src);
//   - both are kernel sockets: io.Copy, which splices in the kernel;
//   - src is a socket (a syscall.Conn): it waits for src to become
//     readable holding no buffer, as ReadFrom does;
//   - otherwise each read is preceded by an empty one, which waits for
//     bytes on readers that wait for empty reads (streams, and wrappers
//     that pass reads on: an HTTP/2 body, an upgraded HTTP/1 connection's
//     body once its read buffer is drained); other readers return at
//     once, and the copy then waits holding its buffer (4 KiB, more
//     while bytes stream).
func Copy(dst io.Writer, src io.Reader) (int64, error) {
	step, whole := plan(dst, src)
	if whole != nil {
		return whole()
	}
	return loop(step)
}

// Go copies src to dst as Copy does, in goroutines of its own, and then
// calls done with what Copy would return. A wait for src's bytes that
// may be long begins in a fresh goroutine, which takes over from the one
// that wrote the bytes before: an idle copy so holds one goroutine whose
// stack is small, where a goroutine that waits after writing keeps the
// stack it grew to write (the writes to a socket or a stream are deep)
// until the runtime shrinks it, if it ever does. A busy copy, whose last
// wait was short (an exchange of small messages), waits in the goroutine
// that wrote, as a plain loop does: starting a goroutine wakes another
// thread of the runtime's, which costs a busy copy more than its copying
// (see hotCopies). A copy that Copy would hand to a WriteTo or ReadFrom
// runs in one goroutine: a wrapper of a stream offers steps instead (see
// StepWriterTo), so that its copies wait on small stacks too.
func Go(dst io.Writer, src io.Reader, done func(int64, error)) {
	step, whole := plan(dst, src)
	if whole != nil {
		go func() { done(whole()) }()
		return
	}
	c := &stepper{step: step, done: done}
	go c.run()
}

// stepper runs a copy's steps: the step after a short wait in the
// goroutine that ran it, the step after a long one in a fresh goroutine.
type stepper struct {
	step  func() (int, error)
	done  func(int64, error)
	total int64 // touched by one goroutine at a time, each started by the last
	hot   bool  // this goroutine holds a place among hotCopies
}

// hotCopies counts the copies that wait in the goroutine that wrote: a
// copy whose last wait was shorter than hotWait takes one of maxHot
// places, if one is free, and keeps it until a wait of its turns out long
// (or it ends). A busy copy that falls idle waits on the stack it grew
// until its next bytes, so the places bound that memory: maxHot stacks of
// a few KiB.
var hotCopies atomic.Int32

const (
	hotWait = time.Millisecond
	maxHot  = 128
)

func (c *stepper) run() {
	for {
		began := clock()
		n, err := c.step()
		c.total += int64(n)
		if err != nil {
			c.cool()
			if err == io.EOF {
				err = nil
			}
			c.done(c.total, err)
			return
		}
		if clock()-began >= hotWait {
			c.cool()
			go c.run()
			return
		}
		if !c.hot {
			if hotCopies.Add(1) > maxHot {
				hotCopies.Add(-1)
				go c.run()
				return
			}
			c.hot = true
		}
	}
}

// cool gives up the copy's place among the hot ones, if it holds one.
func (c *stepper) cool() {
	if c.hot {
		c.hot = false
		hotCopies.Add(-1)
	}
}

// StepWriterTo is a reader whose copy to a writer goes in steps, each a
// wait for bytes and their write: a wrapper of a stream (see WriteSteps).
// Copy and Go run its steps as they run a stream's (Go beginning each
// long wait in a fresh goroutine), where a WriteTo would run the whole
// copy in the goroutine that called it. A step returns the bytes it wrote, and io.EOF
// at the copy's end.
type StepWriterTo interface {
	WriteStep(w io.Writer) (step func() (int, error))
}

// StepReaderFrom is a writer whose copy from a reader goes in steps, as
// StepWriterTo's does.
type StepReaderFrom interface {
	ReadStep(r io.Reader) (step func() (int, error))
}

// WriteSteps returns the copy st.WriteTo makes to w, in steps, for a
// wrapper's WriteStep. They are functions, not methods of Stream, so that
// a wrapper embedding a stream offers steps only when it says so: steps
// promoted from the stream would pass its own Read and WriteTo by.
func WriteSteps(st *Stream, w io.Writer) func() (int, error) {
	if err := st.flushOpen(); err != nil {
		return func() (int, error) { return 0, err }
	}
	return st.writeStep(w)
}

// ReadSteps returns the copy st.ReadFrom makes from r, in steps, for a
// wrapper's ReadStep.
func ReadSteps(st *Stream, r io.Reader) func() (int, error) { return readStep(st, r) }

// RunSteps runs a copy's steps in the calling goroutine until the copy
// ends, as WriteTo and ReadFrom do: the bytes copied, and the first error
// other than io.EOF.
func RunSteps(step func() (int, error)) (int64, error) { return loop(step) }

// WholeStep returns copy, a whole copy, as one step, for a wrapper that
// offers steps but wraps something that copies only whole.
func WholeStep(copy func() (int64, error)) func() (int, error) {
	return func() (int, error) {
		n, err := copy()
		if err == nil {
			err = io.EOF
		}
		return int(n), err
	}
}

// StepsThrough returns the steps of a wrapper's copy to w of src, what it
// wraps: src's own steps (see StepWriterTo), each step's error passed
// through errs; or, when src offers none, whole (the wrapper's copy) as
// one step.
func StepsThrough(w io.Writer, src io.Reader, whole func() (int64, error), errs func(error) error) func() (int, error) {
	var step func() (int, error)
	switch src := src.(type) {
	case *Stream:
		step = WriteSteps(src, w)
	case StepWriterTo:
		step = src.WriteStep(w)
	default:
		return WholeStep(whole)
	}
	return func() (int, error) {
		n, err := step()
		return n, errs(err)
	}
}

// plan decides how Copy copies src to dst: in steps, or as a whole by
// the WriteTo or ReadFrom of another type.
func plan(dst io.Writer, src io.Reader) (step func() (int, error), whole func() (int64, error)) {
	srcSocket, dstSocket := kernelSocket(src), kernelSocket(dst)
	switch src := src.(type) {
	case *Stream:
		return WriteSteps(src, dst), nil
	case StepWriterTo:
		return src.WriteStep(dst), nil
	}
	if wt, ok := src.(io.WriterTo); ok && !srcSocket {
		return nil, func() (int64, error) { return wt.WriteTo(dst) }
	}
	switch dst := dst.(type) {
	case *Stream:
		return readStep(dst, src), nil
	case StepReaderFrom:
		return dst.ReadStep(src), nil
	}
	if rf, ok := dst.(io.ReaderFrom); ok && !dstSocket {
		return nil, func() (int64, error) { return rf.ReadFrom(src) }
	}
	if srcSocket && dstSocket {
		return nil, func() (int64, error) { return io.Copy(dst, src) }
	}
	return readStep(dst, src), nil
}

// kernelSocket reports whether c is one of the net package's sockets,
// whose WriteTo and ReadFrom move bytes in the kernel when the other side
// is a socket too, and through a buffer of their own otherwise.
func kernelSocket(c any) bool {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}

// readStep returns a step that waits for src's bytes, holding no buffer
// where it can (see Copy), and writes them to dst.
func readStep(dst io.Writer, src io.Reader) func() (int, error) {
	var sizes readSize
	read := func() ([]byte, int, error) {
		if _, err := src.Read(nil); err != nil {
			return nil, 0, err
		}
		buf := getChunk(sizes.size())
		n, err := src.Read(buf)
		sizes.saw(n)
		return buf, n, err
	}
	if s := newIdleSocket(src, &sizes); s != nil {
		read = s.read
	}
	return func() (int, error) {
		buf, n, err := read()
		if n > 0 {
			k, werr := dst.Write(buf[:n])
			if werr == nil && k < n {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				err = werr
			}
			n = k
		}
		if buf != nil {
			putChunk(buf)
		}
		return n, err
	}
}

// loop runs step until it fails; io.EOF is the copy's end.
func loop(step func() (int, error)) (int64, error) {
	var total int64
	for {
		n, err := step()
		total += int64(n)
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return total, err
		}
	}
}
