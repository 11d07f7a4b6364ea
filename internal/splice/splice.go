// Package splice joins two connections: what one reads, the other writes,
// both ways at once, until both directions end. When one side ends its
// writing (EOF), the other side's writing is closed in turn (half-close),
// so that protocols that speak after a half-close (a request whose end is
// the client's FIN) keep working.
//
// An idle join holds no copy buffer: each direction is a mux.Go, which
// waits for bytes on sockets and tunnel streams before taking a buffer,
// and waits in a fresh goroutine after each write, so that ten thousand
// idle joined connections cost two small goroutines each and little else.
package splice

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/switchboard-relay/switchboard/internal/mux"
)

// closeWriter is a connection whose writing can end on its own: TCP, TLS,
// Unix sockets, tunnel streams.
type closeWriter interface {
	CloseWrite() error
}

// Result says how much went each way, and why the joining stopped.
type Result struct {
	AToB, BToA int64
	// Err is the first error other than a direction's normal end.
	Err error
}

// Join copies a to b and b to a until both directions end, then closes
// both. A failed direction closes both at once, which ends the other. It
// copies a to b in the caller's goroutine, and b to a in a mux.Go.
func Join(a, b io.ReadWriteCloser) Result {
	done := make(chan Result, 1)
	j := &join{a: a, b: b, done: func(r Result) { done <- r }}
	j.left.Store(2)
	mux.Go(a, b, j.endBToA)
	j.endAToB(mux.Copy(b, a))
	return <-done
}

// Start joins a and b as Join does without waiting: done is called with
// the result once both directions have ended and both are closed. Each
// direction is a mux.Go, so that an idle join holds two goroutines with
// small stacks, and no buffer.
func Start(a, b io.ReadWriteCloser, done func(Result)) {
	j := &join{a: a, b: b, done: done}
	j.left.Store(2)
	mux.Go(b, a, j.endAToB)
	mux.Go(a, b, j.endBToA)
}

func (j *join) endAToB(n int64, err error) {
	j.res.AToB = n
	j.end(j.b, err)
}

func (j *join) endBToA(n int64, err error) {
	j.res.BToA = n
	j.end(j.a, err)
}

// join is one Start's state.
type join struct {
	a, b io.ReadWriteCloser
	done func(Result)
	left atomic.Int32 // directions still copying
	once sync.Once    // guards res.Err
	res  Result       // each count written by its direction before it counts down
}

// fail closes both sides at once, keeping err (nil: a side that cannot
// end its writing alone).
func (j *join) fail(err error) {
	j.once.Do(func() {
		j.res.Err = err
		j.a.Close()
		j.b.Close()
	})
}

// end ends a direction that copied to dst and stopped with err: a normal
// end (or one after the other side closed) ends dst's writing; the last
// direction to end closes both and reports.
func (j *join) end(dst io.ReadWriteCloser, err error) {
	switch cw, ok := dst.(closeWriter); {
	case err != nil && !errors.Is(err, net.ErrClosed):
		j.fail(err)
	case !ok:
		j.fail(nil) // dst cannot end its writing alone: end both
	default:
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			j.fail(err)
		}
	}
	if j.left.Add(-1) == 0 {
		j.a.Close()
		j.b.Close()
		j.done(j.res)
	}
}
