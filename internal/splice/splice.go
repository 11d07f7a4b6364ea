// Package splice joins two connections: what one reads, the other writes,
// both ways at once, until both directions end. When one side ends its
// writing (EOF), the other side's writing is closed in turn (half-close),
// so that protocols that speak after a half-close (a request whose end is
// the client's FIN) keep working.
//
// An idle join holds no copy buffer: each direction is a mux.Copy, which
// waits for bytes on sockets and tunnel streams before taking a buffer, so
// that ten thousand idle joined connections cost their goroutines' stacks
// and little else.
package splice

import (
	"errors"
	"io"
	"net"
	"sync"

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
// runs one goroutine besides the caller's.
func Join(a, b io.ReadWriteCloser) Result {
	var res Result
	var once sync.Once
	fail := func(err error) {
		once.Do(func() {
			res.Err = err
			a.Close()
			b.Close()
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		res.BToA = pipe(a, b, fail)
	}()
	res.AToB = pipe(b, a, fail)
	<-done
	a.Close()
	b.Close()
	return res
}

// pipe copies src to dst, then ends dst's writing; it reports a failure
// (not the end of src) to fail.
func pipe(dst, src io.ReadWriteCloser, fail func(error)) int64 {
	n, err := mux.Copy(dst, src)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		fail(err)
		return n
	}
	if cw, ok := dst.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			fail(err)
		}
		return n
	}
	fail(nil) // dst cannot end its writing alone: end both
	return n
}
