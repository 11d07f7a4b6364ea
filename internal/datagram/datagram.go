// Package datagram carries UDP datagrams over a byte stream: each is its
// length as two big-endian bytes, then its bytes, so that message
// boundaries survive the stream. One stream carries one flow (one client
// address to one service).
package datagram

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// MaxSize is the largest datagram carried: the most a UDP datagram over
// IPv4 holds.
const MaxSize = 65507

// ErrTooLarge means a datagram over MaxSize was written or read.
var ErrTooLarge = fmt.Errorf("datagram over %d bytes", MaxSize)

// Writer writes datagrams to a stream, each in one write, safe for
// concurrent use.
type Writer struct {
	mu  sync.Mutex // guards the fields below
	w   io.Writer
	buf []byte
}

// NewWriter returns a Writer onto w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes p as one datagram.
func (w *Writer) Write(p []byte) (int, error) {
	if len(p) > MaxSize {
		return 0, ErrTooLarge
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = binary.BigEndian.AppendUint16(w.buf[:0], uint16(len(p)))
	w.buf = append(w.buf, p...)
	if _, err := w.w.Write(w.buf); err != nil {
		return 0, err
	}
	if cap(w.buf) > 4<<10 {
		w.buf = nil // keep no large buffer between bursts
	}
	return len(p), nil
}

// Reader reads datagrams from a stream.
type Reader struct {
	r   io.Reader
	hdr [2]byte
}

// NewReader returns a Reader from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Read reads one datagram into p and returns its length. A datagram
// longer than p is cut to len(p) and its rest dropped, as a UDP socket
// does; io.ErrShortBuffer says so.
func (r *Reader) Read(p []byte) (int, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, fmt.Errorf("datagram length cut short: %w", err)
		}
		return 0, err
	}
	n := int(binary.BigEndian.Uint16(r.hdr[:]))
	if n > MaxSize {
		return 0, ErrTooLarge
	}
	k := min(n, len(p))
	if _, err := io.ReadFull(r.r, p[:k]); err != nil {
		return 0, fmt.Errorf("datagram of %d bytes cut short: %w", n, noEOF(err))
	}
	if k < n {
		if _, err := io.CopyN(io.Discard, r.r, int64(n-k)); err != nil {
			return 0, fmt.Errorf("datagram of %d bytes cut short: %w", n, noEOF(err))
		}
		return k, io.ErrShortBuffer
	}
	return n, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
