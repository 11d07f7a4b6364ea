// Package tcpconns owns the account of the connections a relay carries
// for users to devices' services (switchboard connect's streams, mapped
// ports' connections, UDP flows, TLS passthroughs): it counts them in
// metrics labelled by kind and service, tells of each one in the log
// (refusals, which cost their sender nothing, at a bounded rate) and, at a
// bounded rate, in the fleet's event log, and lets a drain wait for
// them and cut what is left.
//
//	t := tcpconns.New(tcpconns.Config{Registry: reg, Logger: log, Record: rec})
//	c := t.Open(tcpconns.Port, "6379", "robot-7/redis", "192.0.2.7:50122", cut)
//	... splice ...
//	c.Close(toDevice, fromDevice)
//
//	t.Wait(ctx)      // a drain: until every connection has ended
//	t.Cut()          // at its deadline: end the others, how many
package tcpconns

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/lograte"
)

// Kind says how a connection reached the relay.
type Kind string

// The kinds of connections.
const (
	Connect     Kind = "connect"     // a TCP stream of switchboard connect
	Port        Kind = "port"        // a TCP connection to a mapped port
	ConnectUDP  Kind = "connect_udp" // a UDP flow of switchboard connect --udp
	PortUDP     Kind = "port_udp"    // a UDP flow through a mapped UDP port
	Passthrough Kind = "passthrough" // a TLS connection passed through by SNI
)

// named reports whether connections of kind are labelled by a service's
// name, which users type (bounded by MaxServiceNames), rather than by a
// mapped port's number, which an operator chose.
func (k Kind) named() bool { return k != Port && k != PortUDP }

// noun is what the log calls a connection of kind.
func (k Kind) noun() string {
	switch k {
	case ConnectUDP, PortUDP:
		return "udp flow"
	case Passthrough:
		return "passthrough"
	}
	return "tcp connection"
}

// Event types the tracker records in the fleet's event log.
const (
	EventConnected    = "tcp.connected"
	EventDisconnected = "tcp.disconnected"
	EventCut          = "tcp.cut" // a drain's deadline cut connections
)

// Reasons a connection is refused, as the refusals metric labels them.
const (
	ReasonForbidden      = "forbidden"          // the credential does not allow it
	ReasonNoDevice       = "no_device"          // the device is not connected
	ReasonUnknownService = "unknown_service"    // the device has no such service
	ReasonRefused        = "refused"            // the device's service refused the dial
	ReasonUnreachable    = "unreachable"        // the device's service could not be reached
	ReasonBusy           = "busy"               // too many streams
	ReasonBadTarget      = "bad_target"         // not DEVICE/SERVICE
	ReasonSource         = "source_not_allowed" // outside the port's allowlist
	ReasonLimit          = "limit"              // the port's connection bound
	ReasonProxyHeader    = "proxy_header"       // the PROXY header could not be sent
)

// DefaultEventsPerSecond bounds the connect and disconnect events one
// relay records: the event log is the fleet's, shared with drains and
// failovers, and one busy port must not push those out. Connections past
// the bound are logged and counted all the same; the next event recorded
// says how many it skipped.
const DefaultEventsPerSecond = 20

// MaxServiceNames bounds the service names connections of each named
// kind (connect's, passthroughs) are labelled with on one relay: users
// type the names, so the first ones seen keep theirs and any later one is
// counted under OtherName.
const MaxServiceNames = 64

// OtherName labels connections of a named kind to a service name past
// MaxServiceNames, and refusals whose name the user typed.
const OtherName = "_other"

// Event is what the tracker records in the fleet's event log.
type Event struct {
	Type, Device, Message string
	DurationMS            float64
}

// Config says where a tracker counts and tells.
type Config struct {
	// Registry takes the metrics; nil keeps them unregistered.
	Registry prometheus.Registerer
	// Logger: nothing logged if nil.
	Logger *slog.Logger
	// Record takes events for the fleet's event log; nil records none.
	Record func(Event)
	// EventsPerSecond: DefaultEventsPerSecond if zero.
	EventsPerSecond int
	// Now is the clock: time.Now if nil.
	Now func() time.Time
}

// Tracker keeps the account of one relay's TCP connections.
type Tracker struct {
	cfg Config
	log *slog.Logger
	m   metrics

	events   *lograte.Limiter // bounds the connect and disconnect events
	refusals *lograte.Limiter // bounds the refusals' log lines: a flood of them costs its sender nothing

	mu    sync.Mutex // guards the fields below
	open  map[*Conn]struct{}
	idle  chan struct{}        // closed when open empties; nil while none wait
	names map[nameKey]*nameUse // service names admitted as labels
}

// New returns a tracker counting into cfg.Registry.
func New(cfg Config) *Tracker {
	cfg.EventsPerSecond = cmp.Or(cfg.EventsPerSecond, DefaultEventsPerSecond)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Tracker{cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)), m: newMetrics(),
		events:   lograte.New(cfg.EventsPerSecond).WithClock(cfg.Now),
		refusals: lograte.New(lograte.DefaultPerSecond).WithClock(cfg.Now),
		open:     map[*Conn]struct{}{}, names: map[nameKey]*nameUse{}}
	if cfg.Registry != nil {
		t.m.register(cfg.Registry)
	}
	return t
}

// Conn is one connection carried, from Open to Close.
type Conn struct {
	t              *Tracker
	kind           Kind
	name           string // the metrics' label
	target, source string
	start          time.Time
	cut            func()
	wasCut         bool // guarded by t.mu
}

// nameKey is a service name admitted as a label for one kind.
type nameKey struct {
	kind Kind
	name string
}

// nameUse is how a service name admitted as a label is used.
type nameUse struct {
	carried bool // a connection to it was carried: the label stays
	open    int  // connections open under it
}

// label returns the name label of a new connection of kind to name: a
// port's number as it is, a service's name while the relay has labelled
// fewer than MaxServiceNames of the kind, else OtherName.
func (t *Tracker) label(kind Kind, name string) string {
	if !kind.named() {
		return name
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	key := nameKey{kind, name}
	if u, ok := t.names[key]; ok {
		u.open++
		return name
	}
	if t.namesOfLocked(kind) >= MaxServiceNames {
		return OtherName
	}
	t.names[key] = &nameUse{open: 1}
	return name
}

// namesOfLocked counts the names admitted as labels of kind.
func (t *Tracker) namesOfLocked(kind Kind) int {
	n := 0
	for k := range t.names {
		if k.kind == kind {
			n++
		}
	}
	return n
}

// release notes that a connection under c's label ended, carried or not.
// A name no connection was carried to, whose device said it has no such
// service (the user typed it), gives its label back once no connection
// is open under it: the refusal counts under OtherName. It returns the
// label the end is counted under.
func (t *Tracker) release(c *Conn, carried bool, reason string) string {
	if !c.kind.named() || c.name == OtherName {
		return c.name
	}
	key := nameKey{c.kind, c.name}
	t.mu.Lock()
	u, ok := t.names[key]
	if !ok {
		t.mu.Unlock()
		return c.name
	}
	u.open--
	u.carried = u.carried || carried
	typed := !u.carried && reason == ReasonUnknownService
	drop := typed && u.open == 0
	if drop {
		delete(t.names, key)
	}
	t.mu.Unlock()
	t.m.openNow.WithLabelValues(string(c.kind), c.name).Dec()
	if drop {
		t.m.opened.DeleteLabelValues(string(c.kind), c.name)
		t.m.openNow.DeleteLabelValues(string(c.kind), c.name)
	}
	if typed {
		return OtherName
	}
	return c.name
}

// Open accounts for a connection from source to target (DEVICE/SERVICE)
// that is carried from now on: name is the service's name (kinds Connect,
// ConnectUDP, Passthrough) or the mapped port's number (Port, PortUDP).
// cut ends it; a drain calls it at its deadline. Call Close when the
// connection ends.
func (t *Tracker) Open(kind Kind, name, target, source string, cut func()) *Conn {
	c := &Conn{t: t, kind: kind, name: t.label(kind, name), target: target, source: source, start: t.cfg.Now(), cut: cut}
	t.mu.Lock()
	t.open[c] = struct{}{}
	t.mu.Unlock()
	t.m.opened.WithLabelValues(string(kind), c.name).Inc()
	t.m.openNow.WithLabelValues(string(kind), c.name).Inc()
	t.log.Info(kind.noun()+" opened", logkey.Kind, kind, logkey.Target, target, logkey.Source, source)
	t.event(Event{Type: EventConnected, Device: device(target),
		Message: fmt.Sprintf("%s %s: %s connected to %s", kind, c.name, source, target)})
	return c
}

// Close accounts for the connection's end, with the bytes carried to the
// device and back.
func (c *Conn) Close(toDevice, fromDevice int64) {
	t := c.t
	if !t.forget(c) {
		return
	}
	t.mu.Lock()
	cut := c.wasCut
	t.mu.Unlock()
	d := t.cfg.Now().Sub(c.start)
	k := string(c.kind)
	if c.kind.named() && c.name != OtherName {
		t.release(c, true, "")
	} else {
		t.m.openNow.WithLabelValues(k, c.name).Dec()
	}
	t.m.bytes.WithLabelValues(k, c.name, "to_device").Add(float64(toDevice))
	t.m.bytes.WithLabelValues(k, c.name, "from_device").Add(float64(fromDevice))
	t.m.duration.WithLabelValues(k, c.name).Observe(d.Seconds())
	cause := "ended"
	if cut {
		cause = "cut by the drain"
	}
	t.log.Info(c.kind.noun()+" closed", logkey.Kind, c.kind, logkey.Target, c.target, logkey.Source, c.source,
		logkey.DurationMS, d.Milliseconds(), logkey.BytesIn, toDevice, logkey.BytesOut, fromDevice, logkey.Cause, cause)
	t.event(Event{Type: EventDisconnected, Device: device(c.target), DurationMS: float64(d.Microseconds()) / 1000,
		Message: fmt.Sprintf("%s %s: %s disconnected from %s (%s), %d bytes to the device, %d back", c.kind, c.name, c.source, c.target, cause, toDevice, fromDevice)})
}

// Refused accounts for a connection the device refused once it was used
// (an open costs no round trip, so the refusal comes with the first bytes):
// it ends as a refusal, not as a connection carried, though Open counted it
// opened.
func (c *Conn) Refused(reason string, err error) {
	t := c.t
	if !t.forget(c) {
		return
	}
	label := c.name
	if c.kind.named() && c.name != OtherName {
		label = t.release(c, false, reason)
	} else {
		t.m.openNow.WithLabelValues(string(c.kind), c.name).Dec()
	}
	t.m.refused.WithLabelValues(string(c.kind), label, reason).Inc()
	t.refusals.InfoTo(t.log, c.kind.noun()+" refused", logkey.Kind, c.kind, logkey.Target, c.target, logkey.Source, c.source, logkey.Reason, reason, logkey.Err, err)
}

// forget takes c out of the open connections, reporting whether it was
// there.
func (t *Tracker) forget(c *Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.open[c]
	delete(t.open, c)
	if len(t.open) == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	return ok
}

// Refuse accounts for a connection refused before anything was carried.
// name is as for Open; pass "" when the user typed it (an unknown
// service), so that it labels nothing.
func (t *Tracker) Refuse(kind Kind, name, target, source, reason string, err error) {
	label := name
	if kind.named() {
		label = t.known(kind, name)
	}
	t.m.refused.WithLabelValues(string(kind), label, reason).Inc()
	t.refusals.InfoTo(t.log, kind.noun()+" refused", logkey.Kind, kind, logkey.Target, target, logkey.Source, source, logkey.Reason, reason, logkey.Err, err)
}

// known returns name when a connection to it was carried, else OtherName:
// a refusal before any open admits no label.
func (t *Tracker) known(kind Kind, name string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if u, ok := t.names[nameKey{kind, name}]; ok && u.carried {
		return name
	}
	return OtherName
}

// Count returns how many connections are open.
func (t *Tracker) Count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.open)
}

// OpenBy counts the open connections of kind by name (service or port).
func (t *Tracker) OpenBy(kind Kind) map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for c := range t.open {
		if c.kind == kind {
			out[c.name]++
		}
	}
	return out
}

// Wait returns when no connection is open, or with ctx's error when ctx
// ends first.
func (t *Tracker) Wait(ctx context.Context) error {
	t.mu.Lock()
	if len(t.open) == 0 {
		t.mu.Unlock()
		return nil
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	idle := t.idle
	t.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cut ends every open connection, as a drain does at its deadline, and
// returns how many it cut. Each one's Close then tells that it was cut.
func (t *Tracker) Cut() int {
	t.mu.Lock()
	var cuts []func()
	for c := range t.open {
		if !c.wasCut {
			c.wasCut = true
			cuts = append(cuts, c.cut)
		}
	}
	t.mu.Unlock()
	for _, cut := range cuts {
		if cut != nil {
			cut()
		}
	}
	return len(cuts)
}

// Record records e in the fleet's event log at once, past the bound on
// connect and disconnect events: a drain's cut, say.
func (t *Tracker) Record(e Event) {
	if t.cfg.Record != nil {
		t.cfg.Record(e)
	}
}

// event records e unless this second's events are spent.
func (t *Tracker) event(e Event) {
	if t.cfg.Record == nil {
		return
	}
	skipped, ok := t.events.Allow()
	if !ok {
		return
	}
	if skipped > 0 {
		e.Message += fmt.Sprintf(" (%d connection events not recorded before this one: over %d a second)", skipped, t.cfg.EventsPerSecond)
	}
	t.cfg.Record(e)
}

func device(target string) string {
	d, _, _ := strings.Cut(target, "/")
	return d
}
