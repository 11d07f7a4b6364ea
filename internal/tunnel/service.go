package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
)

// Errors of OpenService before any stream is opened.
var (
	// ErrNoAgent means no version 2 agent of the device is on this relay.
	ErrNoAgent = errors.New("no version 2 agent of the device is connected to this relay")
	// ErrUnknownService means no agent of the device announced a service
	// of that name and kind (for OpenPassthrough: one it offers for TLS
	// passthrough).
	ErrUnknownService = errors.New("the device's agents announced no such service")
)

// OpenService opens a stream to device's service name of the given kind
// (service.TCP: bytes; service.UDP: one flow's framed datagrams) on the
// version 2 session of the device that announced it and carries the
// fewest streams. The open costs no round trip: an agent's refusal
// (CodeUnknownService, CodeServiceRefused, CodeServiceUnreachable) shows
// as a *ServiceError from the connection's first read or write.
func (p *Pool) OpenService(ctx context.Context, device, name string, kind service.Kind) (net.Conn, error) {
	if kind != service.TCP && kind != service.UDP {
		return nil, fmt.Errorf("device %q, service %q: streams carry tcp or udp services, not %q: %w", device, name, kind, ErrUnknownService)
	}
	return p.openService(ctx, device, name, func(a service.Announced) bool { return a.Kind == kind })
}

// OpenPassthrough opens a stream to device's TCP service name that its
// agent offers for TLS passthrough (service.Announced.Passthrough): a
// user reaches it with no credential, so no other service will do.
func (p *Pool) OpenPassthrough(ctx context.Context, device, name string) (net.Conn, error) {
	return p.openService(ctx, device, name, func(a service.Announced) bool { return a.Kind == service.TCP && a.Passthrough })
}

func (p *Pool) openService(ctx context.Context, device, name string, fits func(service.Announced) bool) (net.Conn, error) {
	c, err := p.pickService(device, name, fits)
	if err != nil {
		return nil, fmt.Errorf("device %q, service %q: %w", device, name, err)
	}
	st, err := c.ms.Open(ctx, []byte(name))
	if err != nil {
		return nil, fmt.Errorf("device %q, service %q: %w", device, name, err)
	}
	return &serviceStream{Stream: st, c: c, name: name}, nil
}

// pickService returns the carrier of device's usable version 2 session
// that announced a service name that fits and has the fewest streams.
func (p *Pool) pickService(device, name string, fits func(service.Announced) bool) (*muxCarrier, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best *muxCarrier
	v2 := false
	for _, s := range p.devices[device] {
		c, ok := s.c.(*muxCarrier)
		if !ok || !s.usable() || c.closing() {
			continue
		}
		v2 = true
		if a, ok := c.services[name]; !ok || !fits(a) {
			continue
		}
		if best == nil || c.ms.NumStreams() < best.ms.NumStreams() {
			best = c
		}
	}
	switch {
	case best != nil:
		return best, nil
	case !v2:
		return nil, ErrNoAgent
	}
	return nil, ErrUnknownService
}

// serviceStream is a stream to a service, whose agent's refusal reads
// as a *ServiceError.
type serviceStream struct {
	*mux.Stream
	c    *muxCarrier
	name string
}

func (s *serviceStream) Read(b []byte) (int, error) {
	n, err := s.Stream.Read(b)
	return n, s.mapError(err)
}

func (s *serviceStream) Write(b []byte) (int, error) {
	n, err := s.Stream.Write(b)
	return n, s.mapError(err)
}

func (s *serviceStream) WriteTo(w io.Writer) (int64, error) {
	n, err := s.Stream.WriteTo(w)
	return n, s.mapError(err)
}

func (s *serviceStream) ReadFrom(r io.Reader) (int64, error) {
	n, err := s.Stream.ReadFrom(r)
	return n, s.mapError(err)
}

// CarriedStream returns the stream: Write changes only its errors.
func (s *serviceStream) CarriedStream() *mux.Stream { return s.Stream }

func (s *serviceStream) mapError(err error) error {
	var re *mux.ResetError
	if errors.As(err, &re) && re.Remote && re.Code >= CodeUnknownService && re.Code <= CodeServiceUnreachable {
		return &ServiceError{Device: s.c.device, Service: s.name, Code: re.Code}
	}
	return err
}
