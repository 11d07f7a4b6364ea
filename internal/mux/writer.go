package mux

import (
	"net"
	"sync"
)

// outFrame is a frame queued to be written. Its payload is the caller's
// memory: a caller waits until the frame is written before reusing it.
type outFrame struct {
	hdr     [headerLen]byte
	payload []byte
	rest    bool // payload is the unwritten end of a frame (see tryWrite): no header of its own
}

func frame(h header, payload []byte) outFrame {
	f := outFrame{payload: payload}
	h.encode(&f.hdr)
	return f
}

// writer is a session's write side. There is no writing goroutine: the
// goroutine that queues frames and finds no one writing writes the whole
// queue, its own frames and whatever others queued meanwhile, in one
// system call, until its own frames are out; then a waiting caller takes
// over. Only control frames queued by the reading goroutine, which must
// never block on the connection, start a goroutine, and only when no one
// is writing.
type writer struct {
	s        *Session
	coalesce bool  // the connection gains nothing from writev: copy frames into one buffer
	direct   *sink // the connection's socket, for tryWrite; nil if it has none

	mu      sync.Mutex // guards the fields below
	cond    sync.Cond  // signalled when frames are written, or writing stops
	queue   []outFrame
	spare   []outFrame // the last batch's slice, for reuse
	queued  uint64     // frames ever queued
	written uint64     // frames ever written (or dropped on error)
	writing bool       // a goroutine is writing a batch; queue and bufs are its
	waiters int        // callers waiting for their frames
	err     error      // the first write error, or why the session ended
	bufs    net.Buffers
}

func (w *writer) init(s *Session) {
	w.s = s
	w.cond.L = &w.mu
	switch s.sock.(type) {
	case *net.TCPConn, *net.UnixConn:
		w.direct = newSink(s.sock)
	default:
		w.coalesce = true // a TLS record per slice would cost more than a copy
	}
}

// directMax is the largest payload tryWrite writes: larger ones are a
// bulk transfer's, which gains nothing from sparing a wake-up.
const directMax = 16 << 10

// tryWrite writes f on the connection from the calling goroutine without
// waiting, if no one is writing and nothing is queued: the reading
// goroutine of another session so passes a stream's bytes on (see
// Stream.tryWrite) without waking a copy's goroutine. What the socket does
// not take at once is queued, ahead of anything queued meanwhile, for a
// goroutine to write. It reports false, having done nothing, when the
// connection is busy or has no socket; f's payload is not kept.
func (w *writer) tryWrite(f outFrame) bool {
	if w.direct == nil || len(f.payload) > directMax {
		return false
	}
	w.mu.Lock()
	if w.err != nil || w.writing || len(w.queue) > 0 {
		w.mu.Unlock()
		return false
	}
	w.writing = true
	w.mu.Unlock()
	buf := getChunk(headerLen + len(f.payload))
	copy(buf, f.hdr[:])
	copy(buf[headerLen:], f.payload)
	k := w.direct.try(buf)
	w.mu.Lock()
	w.writing = false
	if k < len(buf) && w.err == nil {
		rest := outFrame{payload: append([]byte(nil), buf[k:]...), rest: true}
		w.queue = append(w.queue, outFrame{})
		copy(w.queue[1:], w.queue)
		w.queue[0] = rest
		w.queued++ // the batch that writes rest writes what is behind it too
	}
	if w.waiters > 0 {
		w.cond.Broadcast() // one of them may write next, or waits for the writing to stop
	} else {
		w.handOffLocked()
	}
	w.mu.Unlock()
	putChunk(buf)
	return true
}

// send queues frames and returns when they are written. Their payloads
// may be reused after it returns, even with an error.
func (w *writer) send(frames ...outFrame) error {
	seq, err := w.enqueue(frames...)
	if err != nil {
		return err
	}
	return w.wait(seq)
}

// enqueue queues frames, to be written in this order after every frame
// queued before, and returns the number to wait for. It does not block:
// a stream queues its frames under its own lock, so that they go out in
// the order of its changes of state.
func (w *writer) enqueue(frames ...outFrame) (uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	w.queue = append(w.queue, frames...)
	w.queued += uint64(len(frames))
	return w.queued, nil
}

// wait returns when the frames up to number seq are written, writing them
// itself if no one is. After it returns their payloads may be reused,
// even with an error.
func (w *writer) wait(seq uint64) error {
	w.mu.Lock()
	for {
		if w.err != nil {
			// Wait until no batch that may hold our payloads is in flight.
			if !w.writing {
				break
			}
		} else if w.written >= seq {
			break
		} else if !w.writing {
			w.drainLocked(seq)
			continue
		}
		w.waiters++
		w.cond.Wait()
		w.waiters--
	}
	err := w.err
	w.handOffLocked()
	w.mu.Unlock()
	if err != nil {
		w.s.fail(err)
	}
	return err
}

// control queues a frame without waiting for it to be written: for the
// reading goroutine, and for frames no caller waits on. The payload is
// copied.
func (w *writer) control(h header, payload []byte) error {
	f := frame(h, nil)
	if len(payload) > 0 {
		f.payload = append([]byte(nil), payload...)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	w.queue = append(w.queue, f)
	w.queued++
	w.handOffLocked()
	return nil
}

// handOffLocked makes sure that queued frames have a writer: a waiting
// caller if there is one, else a goroutine of their own.
func (w *writer) handOffLocked() {
	if w.writing || len(w.queue) == 0 || w.err != nil {
		return
	}
	if w.waiters > 0 {
		w.cond.Broadcast()
		return
	}
	w.writing = true
	go w.drive()
}

// kick makes sure queued frames get written without waiting for them.
func (w *writer) kick() {
	w.mu.Lock()
	w.handOffLocked()
	w.mu.Unlock()
}

func (w *writer) drive() {
	w.mu.Lock()
	w.writing = false
	w.drainLocked(0)
	err := w.err
	w.handOffLocked()
	w.mu.Unlock()
	if err != nil {
		w.s.fail(err)
	}
}

// drainLocked writes batches until frame number until is written (0: until
// the queue is empty) or a write fails. It unlocks while writing.
func (w *writer) drainLocked(until uint64) {
	w.writing = true
	for w.err == nil && len(w.queue) > 0 && (until == 0 || w.written < until) {
		batch := w.queue
		w.queue = w.spare[:0]
		w.mu.Unlock()
		err := w.write(batch)
		w.mu.Lock()
		clear(batch) // drop the payloads: they are the callers'
		w.spare = batch[:0]
		w.written += uint64(len(batch))
		if err != nil && w.err == nil {
			w.err = err
		}
		w.cond.Broadcast()
	}
	w.writing = false
	if w.waiters > 0 {
		w.cond.Broadcast() // one of them may write next, or waits for the writing to stop
		return
	}
	if len(w.queue) == 0 {
		w.shrinkLocked()
	}
}

// keepFrames is how many frames' room the writer keeps between batches: a
// busy moment's larger arrays are let go once the queue is empty.
const keepFrames = 4

func (w *writer) shrinkLocked() {
	if cap(w.queue) > keepFrames {
		w.queue = nil
	}
	if cap(w.spare) > keepFrames {
		w.spare = nil
	}
	if cap(w.bufs) > 2*keepFrames {
		w.bufs = nil
	}
}

// write writes one batch to the connection.
func (w *writer) write(batch []outFrame) error {
	if w.coalesce {
		return w.writeCopied(batch)
	}
	w.bufs = w.bufs[:0]
	for i := range batch {
		if !batch[i].rest {
			w.bufs = append(w.bufs, batch[i].hdr[:])
		}
		if len(batch[i].payload) > 0 {
			w.bufs = append(w.bufs, batch[i].payload)
		}
	}
	bufs := w.bufs
	if w.direct != nil {
		// What the socket takes at once, without the bookkeeping of a
		// call that may wait (see sysWrite); the rest waits as usual.
		if bufs = w.direct.tryBuffers(bufs); len(bufs) == 0 {
			clear(w.bufs)
			return nil
		}
	}
	_, err := bufs.WriteTo(w.s.sock)
	clear(w.bufs)
	return err
}

// coalesceLimit is the most writeCopied copies into one write; a payload
// larger than a quarter of it is written on its own.
const coalesceLimit = 64 << 10

func (w *writer) writeCopied(batch []outFrame) error {
	buf := getChunk(coalesceLimit)[:0]
	defer func() { putChunk(buf) }()
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		_, err := w.s.sock.Write(buf)
		buf = buf[:0]
		return err
	}
	for i := range batch {
		f := &batch[i]
		big := len(f.payload) > coalesceLimit/4
		if len(buf)+headerLen+len(f.payload) > coalesceLimit && !big || big && len(buf)+headerLen > coalesceLimit {
			if err := flush(); err != nil {
				return err
			}
		}
		if !f.rest {
			buf = append(buf, f.hdr[:]...)
		}
		if big {
			if err := flush(); err != nil {
				return err
			}
			if _, err := w.s.sock.Write(f.payload); err != nil {
				return err
			}
			continue
		}
		buf = append(buf, f.payload...)
	}
	return flush()
}

// fail ends writing: queued frames are dropped, later sends fail with err.
func (w *writer) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
	clear(w.queue)
	w.queue = w.queue[:0]
	w.cond.Broadcast()
}

// waitIdle waits until no goroutine is writing a batch.
func (w *writer) waitIdle() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.writing {
		w.waiters++
		w.cond.Wait()
		w.waiters--
	}
}
