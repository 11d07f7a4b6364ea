package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"

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
	ServeStreamsAway(ctx, conn, l, dial, nil)
}

// ServeStreamsAway serves as ServeStreams does, and calls away (when not
// nil) once the relay sends GOAWAY: the relay drains and opens no more
// streams here, so that the agent may connect to another relay at once
// while the streams open here (long TCP connections) run on to their end.
func ServeStreamsAway(ctx context.Context, conn net.Conn, l Liveness, dial DialService, away func()) {
	l = l.WithDefaults()
	ms := mux.New(conn, mux.Config{Client: true, MaxWindow: MaxWindow, PingAfter: l.Interval, DeadAfter: l.Interval + l.Timeout})
	stop := context.AfterFunc(ctx, func() { ms.Close() })
	defer stop()
	if away != nil {
		watching := make(chan struct{})
		defer func() { <-watching }()
		go func() {
			defer close(watching)
			select {
			case <-ms.PeerGoneAway():
				away()
			case <-ms.Done():
			}
		}()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ms.Close()
	for {
		st, err := ms.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { serveStream(ctx, st, dial) })
	}
}

// serveStream dials the service st names and joins the two: byte for
// byte, or for a UDP service (a *flows.Socket) datagram for datagram,
// the stream's framed ones to the socket's.
func serveStream(ctx context.Context, st *mux.Stream, dial DialService) {
	backend, err := dial(ctx, string(st.Meta()))
	if err != nil {
		st.Reset(dialCode(err))
		return
	}
	if s, ok := backend.(*flows.Socket); ok {
		flows.Join(ctx, st, s.Conn, s.Config)
		return
	}
	join(st, backend)
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
// ended, then closes both. When either side fails (the relay reset the
// stream: the user went away), the other is closed at once.
func join(st *mux.Stream, backend net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := st.WriteTo(backend); err != nil {
			backend.Close()
			return
		}
		if hc, ok := backend.(interface{ CloseWrite() error }); ok {
			hc.CloseWrite()
		}
	})
	// The stream's ReadFrom waits for a socket's bytes holding no buffer
	// and reads it with its own system calls.
	_, err := st.ReadFrom(backend)
	if err != nil {
		st.Reset(mux.CodeCancel)
		backend.Close()
	} else {
		st.CloseWrite()
	}
	wg.Wait()
	backend.Close()
	st.Close()
}

// onlyReader hides a reader's WriteTo, so that io.Copy does not call it
// again.
type onlyReader struct{ io.Reader }
