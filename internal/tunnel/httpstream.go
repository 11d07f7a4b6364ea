package tunnel

import (
	"context"
	"fmt"
	"sync"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
)

// HTTPStream is a stream to the HTTP service of a device's version 2
// agent, opened for another relay that runs its HTTP client over it
// (package forward). The relay here splices it and parses nothing.
type HTTPStream struct {
	*mux.Stream
	// Service is what the agent announced of its HTTP service: the other
	// relay applies its path, Host and protocol.
	Service service.Announced
	// Leaving ends when the agent's session is asked to go (a drain) or
	// is gone: the stream should then carry no new request.
	Leaving context.Context

	s    *Session
	once sync.Once
}

// Done counts the stream out of its device's requests in flight. Call it
// once the stream has ended; later calls do nothing. (A stream made in a
// test, with no session, counts nothing.)
func (h *HTTPStream) Done() {
	h.once.Do(func() {
		if h.s != nil {
			h.s.inflight.Add(-1)
		}
	})
}

// OpenHTTP opens a stream to the HTTP service (service.Default) of
// device's version 2 agent here with the fewest requests in flight, and
// counts it in flight, against the device's limit, until Done. The open
// costs no round trip: an agent's refusal is the stream's reset, with
// CodeUnknownService, CodeServiceRefused or CodeServiceUnreachable.
//
// It returns ErrNoAgent when no version 2 agent of the device that takes
// new requests is here, ErrNoHTTPService when none announced an HTTP
// service, and a *BusyError when the device is at its limit.
func (p *Pool) OpenHTTP(ctx context.Context, device string) (*HTTPStream, error) {
	s, c, leaving, err := p.pickHTTP(device)
	if err != nil {
		return nil, fmt.Errorf("device %q: %w", device, err)
	}
	st, err := c.ms.Open(ctx, []byte(service.Default))
	if err != nil {
		s.inflight.Add(-1)
		return nil, fmt.Errorf("device %q: %w", device, &mux.OpenError{Err: err})
	}
	return &HTTPStream{Stream: st, Service: c.svc, Leaving: leaving, s: s}, nil
}

// pickHTTP returns, counted in flight, device's usable version 2 session
// with an HTTP service and the fewest requests in flight, and its leaving
// context.
func (p *Pool) pickHTTP(device string) (*Session, *muxCarrier, context.Context, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.devices[device]
	var best *Session
	v2, hasService, busy := false, false, false
	for _, s := range list {
		c, ok := s.c.(*muxCarrier)
		if !ok || !s.usable() || c.closing() {
			continue
		}
		v2 = true
		if !c.ok {
			continue
		}
		hasService = true
		if s.inflight.Load() >= p.maxStreams(s, list) {
			busy = true
			continue
		}
		if best == nil || s.inflight.Load() < best.inflight.Load() {
			best = s
		}
	}
	switch {
	case best != nil:
		best.inflight.Add(1)
		return best, best.c.(*muxCarrier), best.leavingLocked(), nil
	case busy:
		p.busy.Add(1)
		return nil, nil, nil, &BusyError{Device: device, DeviceCap: int(p.deviceCap())}
	case v2 && !hasService:
		return nil, nil, nil, ErrNoHTTPService
	}
	return nil, nil, nil, ErrNoAgent
}
