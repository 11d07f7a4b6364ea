package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/switchboard-relay/switchboard/internal/flows"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
)

// DialService connects to the agent's service of the given name, for a
// stream the relay opened. It returns an error wrapping service.ErrUnknown
// for a name the agent does not have.
type DialService func(ctx context.Context, name string) (net.Conn, error)

// ServeStreams serves a version 2 tunnel on an agent's connection until
// the connection dies or ctx ends: each stream the relay opens names one
// of the agent's services, which dial connects to, and the stream and the
// connection are then joined byte for byte, each direction's end passed on
// as a half-close (a UDP service's stream carries one flow's datagrams,
// see internal/flows). A stream whose service is unknown or unreachable is
// reset with a code that tells the relay why (CodeUnknownService,
// CodeServiceRefused, CodeServiceUnreachable). The agent pings after
// l.Interval of silence and gives the relay up after l.Interval+l.Timeout.
// ServeStreams returns once every stream has ended.
func ServeStreams(ctx context.Context, conn net.Conn, l Liveness, dial DialService) {
	ServeStreamsWith(ctx, conn, l, dial, StreamOptions{})
}

// ServeStreamsUntil is ServeStreams, retiring the tunnel when retire is
// closed: it tells the relay to open no more streams here (GOAWAY) and
// closes the connection once the streams in flight have ended, or when
// the relay falls silent. An agent retires its old tunnel so when the
// fleet promoted its standby.
func ServeStreamsUntil(ctx context.Context, conn net.Conn, l Liveness, dial DialService, retire <-chan struct{}) {
	ServeStreamsWith(ctx, conn, l, dial, StreamOptions{Retire: retire})
}

// StreamOptions are ServeStreamsWith's options beyond ServeStreams'.
type StreamOptions struct {
	// Retire, when closed, retires the tunnel (see ServeStreamsUntil).
	Retire <-chan struct{}
	// Away, when set, is called once the relay sends GOAWAY: the relay
	// drains and opens no more streams here, so that the agent may
	// connect to another relay at once while the streams open here (long
	// TCP connections) run on to their end.
	Away func()
	// Fast, when set, is asked every Quick.Interval whether the tunnel
	// should be watched as Quick says rather than as the Liveness given:
	// while it says yes, the agent pings every Quick.Interval and gives the
	// relay up when an answer takes over Quick.Timeout. An agent whose
	// standby tunnel is down watches its tunnel so, since no relay would
	// move its device meanwhile.
	Fast  func() bool
	Quick Liveness
}

// ServeStreamsWith is ServeStreams with o.
func ServeStreamsWith(ctx context.Context, conn net.Conn, l Liveness, dial DialService, o StreamOptions) {
	l = l.WithDefaults()
	ms := mux.New(conn, mux.Config{Client: true, MaxWindow: MaxWindow, PingAfter: l.Interval, DeadAfter: l.Interval + l.Timeout})
	stop := context.AfterFunc(ctx, func() { ms.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ms.Close()
	if o.Retire != nil {
		wg.Go(func() { retireWhen(ms, o.Retire) })
	}
	if o.Fast != nil {
		wg.Go(func() { pingWhile(ms, o.Fast, o.Quick.WithDefaults()) })
	}
	if o.Away != nil {
		wg.Go(func() {
			select {
			case <-ms.PeerGoneAway():
				o.Away()
			case <-ms.Done():
			}
		})
	}
	for {
		st, err := ms.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go serveStream(ctx, st, dial, wg.Done)
	}
}

// retireWhen sends GOAWAY on ms when retire is closed, then closes ms
// when its streams have ended. It returns when ms has ended.
func retireWhen(ms *mux.Session, retire <-chan struct{}) {
	select {
	case <-retire:
	case <-ms.Done():
		return
	}
	ms.GoAway(0)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ms.NumStreams() > 0 {
		select {
		case <-ms.Done():
			return
		case <-tick.C:
		}
	}
	ms.Close()
}

// pingWhile pings ms every q.Interval while fast says so, and closes it
// when a ping goes unanswered for q.Interval+q.Timeout: as long as the
// relay may stay silent before a tunnel without a standby gives it up,
// so that a relay slow to answer under load (a drain, thousands of agents
// arriving) is not given up sooner than its silence says. It returns when
// ms has ended.
func pingWhile(ms *mux.Session, fast func() bool, q Liveness) {
	tick := time.NewTicker(q.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ms.Done():
			return
		case <-tick.C:
		}
		if !fast() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), q.Interval+q.Timeout)
		_, err := ms.Ping(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			ms.Close() // the relay fell silent
			return
		}
	}
}

// serveStream dials the service st names and joins the two: byte for
// byte, or for a UDP service (a *flows.Socket) datagram for datagram,
// the stream's framed ones to the socket's. It calls done once they have
// ended.
func serveStream(ctx context.Context, st *mux.Stream, dial DialService, done func()) {
	backend, err := dial(ctx, string(st.Meta()))
	if err != nil {
		st.Reset(dialCode(err))
		done()
		return
	}
	if s, ok := backend.(*flows.Socket); ok {
		flows.Join(ctx, st, s.Conn, s.Config)
		done()
		return
	}
	join(st, backend, done)
}

// dialCode is the reset code that tells the relay why dialling failed.
func dialCode(err error) uint32 {
	switch {
	case errors.Is(err, service.ErrUnknown):
		return CodeUnknownService
	case errors.Is(err, syscall.ECONNREFUSED):
		return CodeServiceRefused
	}
	return CodeServiceUnreachable
}

// join copies st to backend and backend to st until both directions have
// ended, then closes both and calls done. When either side fails (the
// relay reset the stream: the user went away), the other is closed at
// once; a failed read of the service resets the stream, so that the relay
// tells its user the connection broke rather than ended. Each direction
// is a mux.Go, which waits for bytes holding no buffer, in a goroutine
// with a small stack: an idle connection costs the agent two such
// goroutines, not a goroutine whose stack grew as it dialled and a copy
// buffer held across the wait.
func join(st *mux.Stream, backend net.Conn, done func()) {
	var left atomic.Int32
	left.Store(2)
	end := func() {
		if left.Add(-1) == 0 {
			backend.Close()
			st.Close()
			done()
		}
	}
	mux.Go(backend, st, func(_ int64, err error) {
		switch hc, ok := backend.(interface{ CloseWrite() error }); {
		case err != nil:
			backend.Close()
		case ok:
			hc.CloseWrite()
		}
		end()
	})
	mux.Go(st, backend, func(_ int64, err error) {
		if err != nil {
			st.Reset(mux.CodeCancel)
			backend.Close()
		} else {
			st.CloseWrite()
		}
		end()
	})
}

// onlyReader hides a reader's WriteTo, so that io.Copy does not call it
// again.
type onlyReader struct{ io.Reader }
