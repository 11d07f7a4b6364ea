package tunnel

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/httperr"
)

// DefaultMaxStreams is how many requests a relay sends one native agent at
// once unless configured otherwise (Pool.MaxStreams), and how many
// concurrent streams an agent advertises (HTTP/2 SETTINGS
// MAX_CONCURRENT_STREAMS). A relay never sends an agent more than the agent
// advertises, so that requests beyond it are refused at once rather than
// queued inside the HTTP/2 client.
const DefaultMaxStreams = 256

// DefaultMaxDeviceStreams is how many requests a relay sends at once to
// one device's version 2 agents together unless configured otherwise
// (Pool.MaxDeviceStreams). Version 2 sets no cap per agent: a stream
// costs memory only while its bytes move.
const DefaultMaxDeviceStreams = 10000

// ErrBusy matches a *BusyError with errors.Is.
var ErrBusy = errors.New("every agent of the device is at its cap of requests in flight")

// BusyError is the answer for a device whose native agents all have as many
// requests in flight as they may take: 503 with Retry-After, at once.
type BusyError struct {
	Device string
	Agents int // the device's agents that take requests
	Cap    int // requests in flight per agent at most
	// DeviceCap, when set, is the device's limit of requests in flight
	// over all its version 2 agents, which it has reached.
	DeviceCap int
}

func (e *BusyError) Error() string {
	if e.DeviceCap > 0 {
		return fmt.Sprintf("device %q is busy: it has %d requests in flight, the most this relay sends it at once; try again shortly", e.Device, e.DeviceCap)
	}
	if e.Agents == 1 {
		return fmt.Sprintf("device %q is busy: its agent has %d requests in flight, the most it takes at once; try again shortly", e.Device, e.Cap)
	}
	return fmt.Sprintf("device %q is busy: its %d agents have %d requests in flight each, the most they take at once; try again shortly", e.Device, e.Agents, e.Cap)
}

// Is makes the error match ErrBusy.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// HTTPStatus returns 503.
func (e *BusyError) HTTPStatus() int { return http.StatusServiceUnavailable }

// RetryAfterDelay returns one second: requests in flight usually end soon.
func (e *BusyError) RetryAfterDelay() time.Duration { return time.Second }

// maxStreams is the cap of requests in flight on s, one of the sessions
// of its device. For version 1 it is the pool's cap per agent, or less
// when the agent advertises less. Version 2 has no cap per agent: s may
// take what the device's limit leaves after its other sessions.
func (p *Pool) maxStreams(s *Session, device []*Session) int64 {
	if s.Version == V2 {
		limit := p.deviceCap()
		for _, x := range device {
			if x != s && x.Version == V2 {
				limit -= x.inflight.Load()
			}
		}
		return max(limit, 0)
	}
	limit := int64(p.MaxStreams)
	if limit <= 0 {
		limit = DefaultMaxStreams
	}
	if adv := s.c.perAgentCap(); adv > 0 && adv < limit {
		limit = adv
	}
	return limit
}

// deviceCap is the limit of requests in flight to one device's version 2
// agents together.
func (p *Pool) deviceCap() int64 {
	if p.MaxDeviceStreams > 0 {
		return int64(p.MaxDeviceStreams)
	}
	return DefaultMaxDeviceStreams
}

// usable reports whether s may carry new requests at all, busy or not: it
// is neither draining nor closing.
func (s *Session) usable() bool {
	return !s.draining.Load() && !s.c.closing()
}

// inflightTotal returns the requests in flight on every session.
func (p *Pool) inflightTotal() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, l := range p.devices {
		for _, s := range l {
			n += s.inflight.Load()
		}
	}
	return n
}

// registerStreamMetrics registers the metrics of requests in flight.
func (p *Pool) registerStreamMetrics(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchboard_tunnel_requests_in_flight",
		Help: "User requests in flight over native agent tunnels, upgraded streams included.",
	}, func() float64 { return float64(p.inflightTotal()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "switchboard_tunnel_busy_refusals_total",
			Help: "User requests refused with 503 because every native agent of the device was at its cap of requests in flight, or the device at its limit.",
		}, func() float64 { return float64(p.busy.Load()) }))
}

var (
	_ httperr.StatusError     = (*BusyError)(nil)
	_ httperr.RetryAfterError = (*BusyError)(nil)
)
