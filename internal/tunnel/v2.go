package tunnel

import (
	"context"
	"errors"
	"fmt"
	"github.com/switchboard-relay/switchboard/internal/wire"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/h1"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
)

// Reset codes a version 2 agent answers a stream with when it cannot
// reach the service the stream names. The relay answers the user 502.
const (
	// CodeUnknownService: the agent has no service of that name.
	CodeUnknownService = mux.CodeApplication + iota
	// CodeServiceRefused: the service refused the agent's connection.
	CodeServiceRefused
	// CodeServiceUnreachable: the agent could not connect to the service
	// (no route, a timeout, a failed TLS handshake).
	CodeServiceUnreachable
)

// ServiceError is a request's failure because the device's agent could
// not reach the service: 502, with what happened.
type ServiceError struct {
	Device  string
	Service string
	Code    uint32 // CodeUnknownService, CodeServiceRefused or CodeServiceUnreachable
}

func (e *ServiceError) Error() string {
	switch e.Code {
	case CodeUnknownService:
		return fmt.Sprintf("device %q has no service %q", e.Device, e.Service)
	case CodeServiceRefused:
		return fmt.Sprintf("device %q: its service %q refused the connection", e.Device, e.Service)
	}
	return fmt.Sprintf("device %q: its agent could not connect to its service %q", e.Device, e.Service)
}

// HTTPStatus returns 502.
func (e *ServiceError) HTTPStatus() int { return http.StatusBadGateway }

// ErrNoHTTPService means a version 2 agent announced no HTTP service of
// the name HTTP requests go to (service.Default).
var ErrNoHTTPService = errors.New("the device's agent offers no HTTP service")

// muxCarrier is version 2's carrier: a multiplexed session on which each
// HTTP connection to the agent's HTTP service is one stream, pooled with
// keep-alive, so that the relay is the only HTTP stack and the agent
// copies bytes.
type muxCarrier struct {
	device   string
	ms       *mux.Session
	services map[string]service.Announced // what the agent announced, by name
	svc      service.Announced
	path     string          // svc.Path unescaped
	ok       bool            // the agent announced service.Default
	h1       h1.Client       // HTTP/1.1: every request of an HTTP/1.1 service, the upgrades of an h2c one
	h2       *http.Transport // for an h2c service, its requests but upgrades; nil otherwise
}

// MaxWindow bounds a version 2 stream's receive window, at both ends: the
// most one stream buffers for a reader that does not keep up. 2 MiB is
// 1.7 times the bandwidth-delay product of 100 Mbit/s × 100 ms (1.25 MB),
// so that one stream fills such a link, and keeps a slow reader's cost
// bounded: with 4 MiB, a streamed upload held about twice the memory of
// version 1's (TestNativeStreamedUploadHoldsLittle under -race: 16–25 MiB
// against 10–14), with 2 MiB as much (11–15).
const MaxWindow = 2 << 20

// streamIdleTimeout and maxIdleStreams bound the idle pooled HTTP
// connections to an agent's service, HTTP/2 ones too, as package h1 does.
const (
	streamIdleTimeout = h1.IdleTimeout
	maxIdleStreams    = h1.MaxIdle
)

func newMuxCarrier(device string, ms *mux.Session, services map[string]service.Announced) *muxCarrier {
	c := &muxCarrier{device: device, ms: ms, services: services}
	c.svc, c.ok = services[service.Default]
	c.path, _ = url.PathUnescape(c.svc.Path)
	c.h1.Open = c.open
	if c.svc.H2C {
		c.h2 = c.h2Transport()
	}
	return c
}

// h2Transport returns an HTTP/2 client with prior knowledge whose
// connections are streams to the HTTP service.
func (c *muxCarrier) h2Transport() *http.Transport {
	t := &http.Transport{
		DialContext:         c.dial,
		MaxIdleConns:        0, // no cap: the per-host one bounds it
		MaxIdleConnsPerHost: maxIdleStreams,
		IdleConnTimeout:     streamIdleTimeout,
		DisableCompression:  true, // the backend's encoding passes through untouched
		Protocols:           new(http.Protocols),
	}
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}

// serviceMeta is the metadata of a stream to the HTTP service.
var serviceMeta = []byte(service.Default)

// open opens a stream to the HTTP service. An error here means nothing of
// the request was sent.
func (c *muxCarrier) open(ctx context.Context) (*mux.Stream, error) {
	st, err := c.ms.Open(ctx, serviceMeta)
	if err != nil {
		return nil, &mux.OpenError{Err: err}
	}
	return st, nil
}

// dial is open for net/http's HTTP/2 client.
func (c *muxCarrier) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	st, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	return &clientStream{Stream: st}, nil
}

// clientStream is a stream as net/http's HTTP/2 client holds it. Closing it
// before its sending side was half-closed abandons it (a reset): net/http
// closes a connection when it is done with it or gives up on it (the user
// went away), and the reset makes the agent close its connection to the
// service at once, where a half-close would leave it waiting on a service
// that ignores one. After a half-close (an upgraded stream's end), Close
// is the stream's own, delivering what was written.
type clientStream struct {
	*mux.Stream
	halfClosed atomic.Bool
}

// CloseWrite half-closes the stream.
func (s *clientStream) CloseWrite() error {
	s.halfClosed.Store(true)
	return s.Stream.CloseWrite()
}

// Close resets the stream, or closes it after a half-close.
func (s *clientStream) Close() error {
	if s.halfClosed.Load() {
		return s.Stream.Close()
	}
	return s.Stream.Reset(mux.CodeCancel)
}

func (c *muxCarrier) roundTrip(req *http.Request) (*http.Response, error) {
	if !c.ok {
		return nil, fmt.Errorf("device %q: %w", c.device, ErrNoHTTPService)
	}
	out := c.svc.Outgoing(req, c.path)
	var resp *http.Response
	var err error
	if c.h2 != nil && upgradeType(req.Header) == "" {
		resp, err = c.h2.RoundTrip(out)
	} else {
		resp, err = c.h1.RoundTrip(out)
	}
	if err != nil {
		return nil, c.mapError(err)
	}
	if req.Method == http.MethodGet && slices.Contains(c.svc.Broadcast, req.URL.Path) {
		resp.Header.Set(wire.BroadcastHeader, "1") // as a version 1 agent marks it
	}
	return resp, nil
}

// mapError turns an agent's refusal to reach its service into a
// *ServiceError; other errors pass through for package replay.
func (c *muxCarrier) mapError(err error) error {
	var re *mux.ResetError
	if errors.As(err, &re) && re.Remote && re.Code >= CodeUnknownService && re.Code <= CodeServiceUnreachable {
		return &ServiceError{Device: c.device, Service: service.Default, Code: re.Code}
	}
	return err
}

func (c *muxCarrier) canTake() bool { return !c.closing() }

// closing reports whether the session ended, or its agent sent GOAWAY (it
// retires the tunnel): no stream opens on it any more.
func (c *muxCarrier) closing() bool {
	select {
	case <-c.ms.Done():
		return true
	default:
		return c.ms.GoneAway()
	}
}

func (c *muxCarrier) perAgentCap() int64 { return 0 }

// shutdown tells the agent that no more streams come (GOAWAY), closes the
// idle pooled connections, and closes the session once the streams in
// flight have ended.
func (c *muxCarrier) shutdown(ctx context.Context) error {
	c.ms.GoAway(0)
	c.h1.CloseIdle(true)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c.closeIdle()
		if c.ms.NumStreams() == 0 {
			return c.close()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.ms.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (c *muxCarrier) closeIdle() {
	c.h1.CloseIdle(false)
	if c.h2 != nil {
		c.h2.CloseIdleConnections()
	}
}

func (c *muxCarrier) close() error {
	err := c.ms.Close()
	c.h1.CloseIdle(true)
	if c.h2 != nil {
		c.h2.CloseIdleConnections()
	}
	return err
}

// AddV2 starts a version 2 session on an accepted tunnel connection, whose
// agent announced services, and adds it. The session leaves the pool by
// itself when its connection dies.
func (p *Pool) AddV2(conn net.Conn, device, agentID, instance string, services map[string]service.Announced) (*Session, error) {
	return p.join(p.newV2Session(conn, device, agentID, instance, services, 0, p.remove))
}
