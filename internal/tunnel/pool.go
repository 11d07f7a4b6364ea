package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/replay"
)

// ErrNoSession means no tunnel for the device is connected to this relay.
var ErrNoSession = errors.New("no native tunnel for the device")

// Liveness sets how tunnels detect a silent peer. The agent pings after
// Interval without reading anything and gives up when no answer comes within
// Timeout; the relay, which hears those pings, pings only after 2·Interval of
// silence and gives up after Timeout/2, so that both ends notice a silent
// peer within Interval+Timeout.
type Liveness struct {
	Interval time.Duration // default DefaultPingInterval, 400 ms
	Timeout  time.Duration // default DefaultPingTimeout, 800 ms: a frozen peer is noticed within 1.2 s
}

// Defaults of Liveness.
const (
	DefaultPingInterval = 400 * time.Millisecond
	DefaultPingTimeout  = 800 * time.Millisecond
)

// WithDefaults fills zero fields.
func (l Liveness) WithDefaults() Liveness {
	if l.Interval <= 0 {
		l.Interval = DefaultPingInterval
	}
	if l.Timeout <= 0 {
		l.Timeout = DefaultPingTimeout
	}
	return l
}

// Session is one agent's tunnel as the relay sees it.
type Session struct {
	Device   string
	AgentID  string // the agent credential's id; "" for anonymous agents
	Instance string // the agent process's id
	Version  int    // the tunnel's version, V1 or V2
	c        carrier
	inflight atomic.Int64
	draining atomic.Bool // asked to finish its streams and go (GOAWAY)
	paced    bool        // its agent announced its ping interval (PingHeader), so knows hot standby
	pool     *Pool
	done     chan struct{} // closed when the connection has died
	gone     bool          // taken out of the pool; guarded by pool.mu
	// leaving ends when the session is asked to go (drain) or leaves the
	// pool: streams spliced onto it from another relay are then retired.
	// It is made for the first stream that needs it (leavingLocked), so
	// that an idle session holds none; left is set once it has ended.
	// All three are guarded by pool.mu.
	leaving context.Context
	leave   context.CancelFunc
	left    bool
}

// leavingLocked returns the session's leaving context, made now if no
// stream needed it before. The pool's lock is held.
func (s *Session) leavingLocked() context.Context {
	if s.leaving == nil {
		s.leaving, s.leave = context.WithCancel(context.Background())
		if s.left {
			s.leave()
		}
	}
	return s.leaving
}

// leftLocked ends the session's leaving context. The pool's lock is held.
func (s *Session) leftLocked() {
	s.left = true
	if s.leave != nil {
		s.leave()
	}
}

// goes ends the session's leaving context.
func (s *Session) goes() {
	s.pool.mu.Lock()
	s.leftLocked()
	s.pool.mu.Unlock()
}

// Done is closed when the session's connection has died or been closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Inflight returns the requests in flight on the session.
func (s *Session) Inflight() int64 { return s.inflight.Load() }

// Close closes the tunnel connection.
func (s *Session) Close() error { return s.c.close() }

// RoundTrip sends one request to the agent.
func (s *Session) RoundTrip(req *http.Request) (*http.Response, error) { return s.c.roundTrip(req) }

// carrier is what a session's requests travel on: an HTTP/2 client
// connection (version 1) or a multiplexed session whose streams are HTTP
// connections to the agent's service (version 2).
type carrier interface {
	roundTrip(*http.Request) (*http.Response, error)
	// canTake reports whether a new request may start now.
	canTake() bool
	// closing reports whether the carrier is closed or closing.
	closing() bool
	// perAgentCap returns the most requests in flight the carrier itself
	// takes (an HTTP/2 peer's SETTINGS), or 0 when it sets no cap.
	perAgentCap() int64
	// shutdown stops new requests, lets those in flight finish, then
	// closes; it returns when it has, or with ctx's error.
	shutdown(ctx context.Context) error
	close() error
}

// h2Carrier is version 1's carrier.
type h2Carrier struct{ cc *http2.ClientConn }

func (c h2Carrier) roundTrip(req *http.Request) (*http.Response, error) {
	if proto := upgradeType(req.Header); proto != "" {
		return upgradeRoundTrip(c.cc, req, proto)
	}
	return c.cc.RoundTrip(req)
}

func (c h2Carrier) canTake() bool { return c.cc.CanTakeNewRequest() }

func (c h2Carrier) closing() bool {
	st := c.cc.State()
	return st.Closed || st.Closing
}

func (c h2Carrier) perAgentCap() int64 { return int64(c.cc.State().MaxConcurrentStreams) }

func (c h2Carrier) shutdown(ctx context.Context) error { return c.cc.Shutdown(ctx) }

func (c h2Carrier) close() error { return c.cc.Close() }

// Pool holds the relay's tunnel sessions by device and spreads requests over
// a device's sessions, least in-flight first. It implements http.RoundTripper
// for requests whose URL host is the device name.
type Pool struct {
	t    *http2.Transport
	live Liveness
	log  *slog.Logger
	// watchers counts the version 2 sessions not yet taken out after
	// their end (mux.Session.AfterFunc does it); Close waits for them.
	watchers sync.WaitGroup

	// OnChange, if set before the first Add, is called after a session
	// joins or leaves. It must not block.
	OnChange func()
	// MaxStreams, if set before the first request, caps the requests in
	// flight on one session (less if its agent advertises less); a device
	// whose sessions are all at their cap answers 503 at once (BusyError).
	// Default DefaultMaxStreams (256).
	MaxStreams int
	// MaxDeviceStreams, if set before the first request, caps the
	// requests in flight to one device's version 2 agents together;
	// beyond it the device answers 503 at once (BusyError). Default
	// DefaultMaxDeviceStreams (10,000).
	MaxDeviceStreams int

	connects atomic.Int64                             // sessions ever added
	busy     atomic.Int64                             // requests refused with a BusyError
	promoted atomic.Int64                             // standby tunnels promoted (standby.go)
	drainFor atomic.Int64                             // while > 0, the window in which new sessions are sent on too
	movable  atomic.Pointer[func(device string) bool] // DrainSessions' check; see there

	mu      sync.Mutex // guards the fields below
	devices map[string][]*Session
	turn    int                   // rotates the first choice among equally loaded sessions
	standby map[string][]*Session // standby tunnels by device, apart until promoted (standby.go)
}

// NewPool returns an empty pool whose sessions use liveness.
func NewPool(l Liveness, log *slog.Logger) *Pool {
	l = l.WithDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Pool{
		t: &http2.Transport{
			AllowHTTP:        true,
			ReadIdleTimeout:  2 * l.Interval,
			PingTimeout:      l.Timeout / 2,
			WriteByteTimeout: 10 * time.Second,
		},
		live:    l,
		log:     log,
		devices: make(map[string][]*Session),
	}
}

// Add starts HTTP/2 on an accepted tunnel connection and adds the session.
// The session leaves the pool by itself when its connection dies.
func (p *Pool) Add(conn net.Conn, device, agentID, instance string) (*Session, error) {
	s := &Session{Device: device, AgentID: agentID, Instance: instance, Version: V1, pool: p, done: make(chan struct{})}
	cc, err := p.t.NewClientConn(&watchedConn{Conn: conn, onDead: func() {
		p.remove(s)
		close(s.done)
	}})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("start HTTP/2 on the tunnel: %w", err)
	}
	s.c = h2Carrier{cc}
	return p.join(s)
}

// join adds a started session to the pool.
func (p *Pool) join(s *Session) (*Session, error) {
	device, instance := s.Device, s.Instance
	if testHookStarted != nil {
		testHookStarted()
	}
	p.mu.Lock()
	if s.gone {
		s.leftLocked()
		// The connection died while HTTP/2 started on it (an agent that
		// sent garbage at once): it never joins the pool.
		p.mu.Unlock()
		return nil, errors.New("the tunnel closed as it opened")
	}
	p.devices[device] = append(p.devices[device], s)
	p.mu.Unlock()
	p.connects.Add(1)
	if w := time.Duration(p.drainFor.Load()); w > 0 {
		// The relay drains: an agent it had to take anyway (no other relay
		// would) is sent on again later, when another may.
		p.drainLater(s, w/2+rand.N(w/2+1))
	}
	p.changed()
	p.log.Debug("tunnel connected", logkey.Device, device, logkey.Instance, instance)
	return s, nil
}

// testHookStarted, when set, runs after HTTP/2 has started on a new tunnel
// and before the session joins the pool.
var testHookStarted func()

func (p *Pool) changed() {
	if p.OnChange != nil {
		p.OnChange()
	}
}

// remove takes s out of the pool.
func (p *Pool) remove(s *Session) {
	defer p.changed()
	p.mu.Lock()
	defer p.mu.Unlock()
	s.gone = true
	s.leftLocked()
	list := p.devices[s.Device]
	for i, x := range list {
		if x == s {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(p.devices, s.Device)
	} else {
		p.devices[s.Device] = list
	}
}

// pick returns the device's session with the fewest requests in flight
// below its cap, counting the request in flight on it. When every usable
// session is at its cap it returns a *BusyError; with none usable, nil.
func (p *Pool) pick(device string, skip map[*Session]bool) (*Session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.devices[device]
	p.turn++
	var best *Session
	busy := &BusyError{Device: device}
	for i := range list {
		s := list[(p.turn+i)%len(list)]
		if skip[s] || !s.usable() {
			continue
		}
		if limit := p.maxStreams(s, list); s.inflight.Load() >= limit || !s.c.canTake() {
			busy.Agents++
			if s.Version == V2 {
				busy.DeviceCap = int(p.deviceCap())
			} else {
				busy.Cap = max(busy.Cap, int(limit))
			}
			continue
		}
		if best == nil || s.inflight.Load() < best.inflight.Load() {
			best = s
		}
	}
	if best == nil && busy.Agents > 0 {
		p.busy.Add(1)
		return nil, busy
	}
	if best != nil {
		best.inflight.Add(1)
	}
	return best, nil
}

// Has reports whether device has a tunnel on this relay.
func (p *Pool) Has(device string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.devices[device]) > 0
}

// Devices returns the devices with a tunnel on this relay.
func (p *Pool) Devices() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	names := make([]string, 0, len(p.devices))
	for d := range p.devices {
		names = append(names, d)
	}
	return names
}

// CloseDevice closes every session of device, cutting its streams; its
// agents reconnect. Sessions already draining are left to finish. It
// returns how many it closed.
func (p *Pool) CloseDevice(device string) int {
	return p.eachLive(device, func(s *Session) { s.Close() })
}

// DrainDevice asks the agents of device's sessions to go, as a drain does
// (a GOAWAY: streams in flight finish), so that they reconnect through the
// address they dialled. It returns how many it asked.
func (p *Pool) DrainDevice(device string) int { return p.eachLive(device, (*Session).drain) }

// eachLive calls f on each session of device that is not draining, outside
// the lock, and returns how many it called it on.
func (p *Pool) eachLive(device string, f func(*Session)) int {
	p.mu.Lock()
	list := slices.Clone(p.devices[device])
	p.mu.Unlock()
	n := 0
	for _, s := range list {
		if !s.draining.Load() {
			f(s)
			n++
		}
	}
	return n
}

// CloseAgent closes every session opened with the credential agentID,
// draining or not, cutting its streams: the credential was revoked. It
// returns how many it closed.
func (p *Pool) CloseAgent(agentID string) int {
	if agentID == "" {
		return 0
	}
	p.mu.Lock()
	var list []*Session
	for _, ss := range p.devices {
		for _, s := range ss {
			if s.AgentID == agentID {
				list = append(list, s)
			}
		}
	}
	for _, ss := range p.standby {
		for _, s := range ss {
			if s.AgentID == agentID {
				list = append(list, s)
			}
		}
	}
	p.mu.Unlock()
	for _, s := range list {
		s.Close()
	}
	return len(list)
}

// Ready reports whether device has a session that takes new requests.
func (p *Pool) Ready(device string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.devices[device] {
		if s.usable() { // busy or not: a busy device answers 503 here
			return true
		}
	}
	return false
}

// DrainSessions asks every session to finish its streams and go (HTTP/2
// GOAWAY), each at a random moment within window, so that the agents
// reconnect elsewhere spread out rather than all at once. It returns at
// once; sessions that join while the pool drains are sent on later too.
//
// movable, when not nil, is asked at each session's moment whether another
// relay would take the device's agent now; while it says no, the session
// stays and is asked about again later, so that a relay that drains does
// not send its agents to a sibling it sees failing (they would come back
// at once, all together) and then take them again. Nil sends every session.
func (p *Pool) DrainSessions(window time.Duration, movable func(device string) bool) int {
	p.drainFor.Store(int64(max(window, time.Second)))
	p.movable.Store(&movable)
	p.mu.Lock()
	var all []*Session
	for _, l := range p.devices {
		all = append(all, l...)
	}
	p.mu.Unlock()
	for _, s := range all {
		delay := time.Duration(0)
		if window > 0 {
			delay = rand.N(window)
		}
		p.drainLater(s, delay)
	}
	return len(all)
}

// StopDraining ends DrainSessions: sessions not sent on yet stay.
func (p *Pool) StopDraining() { p.drainFor.Store(0) }

// drainLater drains s after delay, if the pool still drains then and the
// device may move; else, while the pool drains, it asks again later.
func (p *Pool) drainLater(s *Session, delay time.Duration) {
	time.AfterFunc(delay, func() {
		w := time.Duration(p.drainFor.Load())
		select {
		case <-s.done:
			return
		default:
		}
		if w == 0 {
			return
		}
		if mv := p.movable.Load(); mv != nil && *mv != nil && !(*mv)(s.Device) {
			p.drainLater(s, w/2+rand.N(w/2+1))
			return
		}
		s.drain()
	})
}

// drain sends the session's agent a GOAWAY: streams in flight finish, then
// the connection closes.
func (s *Session) drain() {
	if s.draining.Swap(true) {
		return
	}
	s.goes()
	go s.c.shutdown(context.Background()) // ends when the streams do, or the connection dies
}

// Connects returns how many sessions were ever added.
func (p *Pool) Connects() int64 { return p.connects.Load() }

// Presence counts the sessions of each device.
func (p *Pool) Presence() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.devices))
	for d, l := range p.devices {
		out[d] = len(l)
	}
	return out
}

// Versions returns the tunnel versions of device's sessions.
func (p *Pool) Versions(device string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var vs []int
	for _, s := range p.devices[device] {
		vs = append(vs, s.Version)
	}
	return vs
}

// Sessions returns how many tunnels are connected.
func (p *Pool) Sessions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.devices {
		n += len(l)
	}
	return n
}

// Close closes every session, standbys included.
func (p *Pool) Close() {
	p.mu.Lock()
	var all []*Session
	for _, l := range p.devices {
		all = append(all, l...)
	}
	for _, l := range p.standby {
		all = append(all, l...)
	}
	p.mu.Unlock()
	for _, s := range all {
		s.Close()
	}
	p.watchers.Wait()
}

// Shutdown asks every session's agent to finish its streams (HTTP/2 GOAWAY)
// and waits until they have, or until ctx ends.
func (p *Pool) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	var all []*Session
	for _, l := range p.devices {
		all = append(all, l...)
	}
	p.mu.Unlock()
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, s := range all {
		s.draining.Store(true)
		s.goes()
		wg.Go(func() { errs[i] = s.c.shutdown(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// WaitEmpty returns when no session is left, or with ctx's error when ctx
// ends first.
func (p *Pool) WaitEmpty(ctx context.Context) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for p.Sessions() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// RoundTrip sends req to a tunnel of the device named by req.URL.Host. A
// session that fails before the request left moves it to the next session;
// with none left it returns ErrNoSession. A request lost with its session
// (the connection died before any answer) comes back with the session's
// error: whether it may be sent again, and where, is its router's call
// (package replay). When every session is at its cap of requests in
// flight it returns a *BusyError (503) at once.
func (p *Pool) RoundTrip(req *http.Request) (*http.Response, error) {
	device := req.URL.Host
	var tried map[*Session]bool
	for {
		s, err := p.pick(device, tried)
		if err != nil {
			return nil, err
		}
		if s == nil {
			return nil, fmt.Errorf("device %q: %w", device, ErrNoSession)
		}
		resp, err := s.RoundTrip(req)
		if err == nil {
			resp.Body = &countedBody{ReadCloser: resp.Body, s: s}
			return resp, nil
		}
		s.inflight.Add(-1)
		if !unsent(err, req) {
			return nil, err
		}
		if tried == nil {
			tried = make(map[*Session]bool)
		}
		tried[s] = true
	}
}

// unsent reports whether err means that req never reached the agent, so
// that another session may take it, its body rewound.
func unsent(err error, req *http.Request) bool {
	if errors.Is(err, http2.ErrNoCachedConn) {
		return true // refused before anything of req was read
	}
	return replay.Classify(err) == replay.Unopened && replay.Rewind(req)
}

// countedBody counts a request as in flight until its response body closes.
type countedBody struct {
	io.ReadCloser
	s    *Session
	done atomic.Bool
}

func (b *countedBody) Close() error {
	if b.done.CompareAndSwap(false, true) {
		b.s.inflight.Add(-1)
	}
	return b.ReadCloser.Close()
}

// Write passes through for upgraded streams, whose body is writable.
func (b *countedBody) Write(p []byte) (int, error) {
	w, ok := b.ReadCloser.(io.Writer)
	if !ok {
		return 0, errors.New("response body is not writable")
	}
	return w.Write(p)
}

// CloseWrite passes a half-close through for upgraded streams.
func (b *countedBody) CloseWrite() error {
	if cw, ok := b.ReadCloser.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// WriteTo passes an upgraded stream's own copying through (io.Copy
// from the body), so that no copy buffer of io.Copy's is held for it.
func (b *countedBody) WriteTo(w io.Writer) (int64, error) {
	if wt, ok := b.ReadCloser.(io.WriterTo); ok {
		return wt.WriteTo(w)
	}
	return io.Copy(w, onlyReader{b.ReadCloser})
}

// ReadFrom passes an upgraded stream's own copying through (io.Copy to
// the body).
func (b *countedBody) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := b.ReadCloser.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(onlyWriter{b}, r)
}

// WriteStep and ReadStep pass an upgraded stream's copying in steps
// through (see mux.StepWriterTo), so that copies of it wait on small
// stacks; a body that copies only whole is one step.
func (b *countedBody) WriteStep(w io.Writer) func() (int, error) {
	if sw, ok := b.ReadCloser.(mux.StepWriterTo); ok {
		return sw.WriteStep(w)
	}
	return mux.WholeStep(func() (int64, error) { return b.WriteTo(w) })
}

func (b *countedBody) ReadStep(r io.Reader) func() (int, error) {
	if sr, ok := b.ReadCloser.(mux.StepReaderFrom); ok {
		return sr.ReadStep(r)
	}
	return mux.WholeStep(func() (int64, error) { return b.ReadFrom(r) })
}

// watchedConn calls onDead once when the connection fails or closes.
type watchedConn struct {
	net.Conn
	once   sync.Once
	onDead func()
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(c.onDead)
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.once.Do(c.onDead)
	return c.Conn.Close()
}

// RegisterMetrics registers the pool's metrics with reg.
func (p *Pool) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchboard_tunnel_sessions",
		Help: "Native agent tunnels connected to this relay.",
	}, func() float64 { return float64(p.Sessions()) }))
	p.registerStreamMetrics(reg)
	p.registerStandbyMetrics(reg)
}

// onlyWriter hides a writer's ReadFrom from io.Copy.
type onlyWriter struct{ io.Writer }
