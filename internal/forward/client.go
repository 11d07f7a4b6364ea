package forward

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/h1"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// Defaults of Config.
const (
	// DefaultUnofferedFor is how long a holder that refused the upgrade
	// (a relay from before stream forwards) is not asked again.
	DefaultUnofferedFor = 10 * time.Second
	// DefaultUnavailableFor is how long a device whose holder served no
	// stream to it (a version 1 or long-poll agent) is forwarded over HTTP
	// without asking again.
	DefaultUnavailableFor = 2 * time.Second
)

// Config sets up a Forwarder.
type Config struct {
	// Sign returns the peer signature for device, or for SessionScope:
	// peer.Signer.Signature. Required.
	Sign func(device string) string
	// TLS verifies holders advertised at https:// URLs; nil means the
	// system roots.
	TLS *tls.Config
	// UnofferedFor and UnavailableFor: see DefaultUnofferedFor and
	// DefaultUnavailableFor, their defaults.
	UnofferedFor, UnavailableFor time.Duration
	// PingAfter and DeadAfter are the liveness checks of a holder's
	// session. Defaults 1 s and 3 s: a holder that dies is noticed about
	// as soon as the watchdog notices it.
	PingAfter, DeadAfter time.Duration
}

// Forwarder sends HTTP requests to the relays holding their devices over
// streams: one session per holder, and per device an HTTP client whose
// connections are streams to the device's agent through the holder,
// pooled with keep-alive: package h1's, the one the relay runs over its
// own agents' tunnels, and net/http's HTTP/2 client for an h2c service.
type Forwarder struct {
	cfg Config

	streams, unavailable atomic.Int64 // streams opened; requests sent over HTTP instead
	notices              atomic.Int64 // holders' notices to retire a stream, read

	mu      sync.Mutex // guards the fields below
	holders map[string]*holder
	routes  map[routeKey]*route
	closed  bool
}

type routeKey struct{ holder, device string }

// NewForwarder returns a forwarder; it connects to a holder at the first
// request for one of its devices.
func NewForwarder(cfg Config) *Forwarder {
	if cfg.UnofferedFor <= 0 {
		cfg.UnofferedFor = DefaultUnofferedFor
	}
	if cfg.UnavailableFor <= 0 {
		cfg.UnavailableFor = DefaultUnavailableFor
	}
	if cfg.PingAfter <= 0 {
		cfg.PingAfter = time.Second
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = 3 * time.Second
	}
	return &Forwarder{cfg: cfg, holders: map[string]*holder{}, routes: map[routeKey]*route{}}
}

// RoundTrip sends req, whose URL host is its device, to the device's agent
// at the relay holderID, advertised at address, over a stream. It returns
// an error wrapping ErrUnavailable, having sent nothing and left req's
// body unread, when the holder serves no stream to the device's HTTP
// service, or when the request must meet the holder's own HTTP handling
// (a GET of a path the agent shares between viewers). Other errors are
// the stream's and the HTTP client's, for package replay.
func (f *Forwarder) RoundTrip(req *http.Request, holderID, address string) (*http.Response, error) {
	r, err := f.route(holderID, address, req.URL.Host)
	if err != nil {
		return nil, err
	}
	resp, err := r.roundTrip(req)
	if errors.Is(err, ErrUnavailable) {
		f.unavailable.Add(1)
	}
	return resp, err
}

// Open opens a stream to the HTTP service of device's agent through the
// relay holderID, advertised at address, and returns it with the holder's
// announcement of the service (its path, Host and protocol, which the
// caller applies), for an HTTP client of the caller's own to run over.
// Errors are RoundTrip's: ErrUnavailable when the holder serves none.
func (f *Forwarder) Open(ctx context.Context, holderID, address, device string) (net.Conn, service.Announced, error) {
	r, err := f.route(holderID, address, device)
	if err != nil {
		return nil, service.Announced{}, err
	}
	c, k, err := r.h.open(ctx, device)
	if err != nil {
		return nil, service.Announced{}, err
	}
	return c, k.svc, nil
}

// Streams returns how many streams were opened to holders.
func (f *Forwarder) Streams() int64 { return f.streams.Load() }

// Unavailable returns how many requests were left to go over HTTP.
func (f *Forwarder) Unavailable() int64 { return f.unavailable.Load() }

// RegisterMetrics registers the forwarder's counters with reg.
func (f *Forwarder) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_forward_streams_total",
		Help: "Streams opened to the relays holding devices, each carrying HTTP connections to a device's agent.",
	}, func() float64 { return float64(f.streams.Load()) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "switchboard_forward_over_http_total",
		Help: "Forwarded user requests sent over HTTP to the holder because it offered no stream to the device.",
	}, func() float64 { return float64(f.unavailable.Load()) }))
}

// Close ends every session to a holder, and their streams.
func (f *Forwarder) Close() {
	f.mu.Lock()
	f.closed = true
	holders := f.holders
	routes := f.routes
	f.holders, f.routes = map[string]*holder{}, map[routeKey]*route{}
	f.mu.Unlock()
	for _, r := range routes {
		r.close()
	}
	for _, h := range holders {
		h.client.Close()
	}
}

// route returns the device's route through holderID, made at first use.
func (f *Forwarder) route(holderID, address, device string) (*route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("%w: this relay is stopping", ErrUnavailable)
	}
	h := f.holders[holderID]
	if h == nil || h.address != address {
		u, err := url.Parse(address)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%w: relay %s advertises %q", ErrUnavailable, holderID, address)
		}
		if h != nil {
			h.client.Close() // the holder moved: its old session goes
		}
		h = f.newHolder(holderID, address, u)
		f.holders[holderID] = h
	}
	k := routeKey{holderID, device}
	r := f.routes[k]
	if r == nil || r.h != h {
		if r != nil {
			r.close()
		}
		r = &route{h: h, device: device}
		f.routes[k] = r
	}
	return r, nil
}

// streamKey names a stream: its session (one after another to a holder)
// and its id there.
type streamKey struct {
	s  *mux.Session
	id uint32
}

// holder is the session to one relay holding devices.
type holder struct {
	f       *Forwarder
	id      string
	address string
	client  *connect.Client

	mu        sync.Mutex // guards the fields below
	conns     map[streamKey]*conn
	unoffered time.Time // until then, the holder is not asked
}

func (f *Forwarder) newHolder(id, address string, u *url.URL) *holder {
	h := &holder{f: f, id: id, address: address, conns: map[streamKey]*conn{}}
	h.client = connect.NewClient(connect.ClientConfig{
		Relay:     u,
		TLS:       f.cfg.TLS,
		Path:      Path,
		Protocol:  Protocol,
		Sign:      func(hd http.Header) { hd.Set(peer.Header, f.cfg.Sign(SessionScope)) },
		PingAfter: f.cfg.PingAfter,
		DeadAfter: f.cfg.DeadAfter,
		Accept:    h.notice,
	})
	return h
}

// notice reads a stream the holder opened: a stream of ours to retire.
func (h *holder) notice(st *mux.Stream) {
	id, ok := parseRetire(st.Meta())
	st.Close()
	if !ok {
		return
	}
	defer h.f.notices.Add(1)
	h.mu.Lock()
	c := h.conns[streamKey{st.Session(), id}]
	h.mu.Unlock()
	if c != nil {
		c.retire()
	}
}

// open opens a stream to device's HTTP service through the holder and
// reads the holder's announcement of it.
func (h *holder) open(ctx context.Context, device string) (*conn, *generationKey, error) {
	h.mu.Lock()
	skip := time.Now().Before(h.unoffered)
	h.mu.Unlock()
	if skip {
		return nil, nil, fmt.Errorf("%w: relay %s takes no stream forwards", ErrUnavailable, h.id)
	}
	st, err := h.client.Open(ctx, openMeta(device, h.f.cfg.Sign(device)))
	if err != nil {
		var he *connect.HandshakeError
		if errors.As(err, &he) {
			h.mu.Lock()
			h.unoffered = time.Now().Add(h.f.cfg.UnofferedFor)
			h.mu.Unlock()
			return nil, nil, fmt.Errorf("%w: relay %s: %w", ErrUnavailable, h.id, err)
		}
		if errors.Is(err, mux.ErrSessionClosed) || errors.Is(err, mux.ErrTimeout) {
			err = &mux.OpenError{Err: err} // the session ended as the stream opened: nothing was sent
		}
		return nil, nil, err // or a dial that failed: package replay reads it
	}
	h.f.streams.Add(1)
	c := &conn{Stream: st, h: h}
	h.mu.Lock()
	h.conns[streamKey{st.Session(), st.ID()}] = c
	h.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Unix(1, 0)) })
	svc, raw, err := readPreamble(st)
	stop()
	if err != nil {
		c.Close()
		var re *mux.ResetError
		switch {
		case errors.As(err, &re) && re.Remote && re.Code == CodeUnavailable:
			return nil, nil, fmt.Errorf("%w: relay %s has no version 2 agent of device %q", ErrUnavailable, h.id, device)
		case errors.As(err, &re) && re.Remote && re.Code == CodeBusy:
			return nil, nil, &BusyError{Device: device, Relay: h.id}
		case ctx.Err() != nil:
			return nil, nil, ctx.Err()
		}
		// Nothing of the request was sent: it may go again.
		return nil, nil, &mux.OpenError{Err: err}
	}
	st.SetReadDeadline(time.Time{})
	return c, &generationKey{raw: raw, svc: svc}, nil
}

// route is one device's HTTP client through one holder: clients whose
// connections are streams, made for the service as the holder announced
// it, and made anew when the announcement changes (the agent came back
// with other settings).
type route struct {
	h      *holder
	device string

	mu          sync.Mutex // guards the fields below
	gen         *generation
	spare       *conn     // a stream opened to learn the announcement, for the next dial
	unavailable time.Time // until then, requests go over HTTP
	retiring    int       // HTTP/2 streams the holder asked to retire that are still open
	ticking     bool      // closeIdle runs while streams retire
	retireBy    time.Time // the retiring streams are waited for until then
	closed      bool
}

// generationKey is an announcement of the service, as the holder sent it.
type generationKey struct {
	raw []byte
	svc service.Announced
}

// generation is the client for one announcement of the service.
type generation struct {
	generationKey
	path string          // svc.Path unescaped
	h1   h1.Client       // HTTP/1.1: every request of an HTTP/1.1 service, the upgrades of an h2c one
	h2   *http.Transport // an h2c service's other requests; nil otherwise
}

func (r *route) newGeneration(k *generationKey) *generation {
	g := &generation{generationKey: *k}
	g.path, _ = url.PathUnescape(g.svc.Path)
	g.h1.Open = func(ctx context.Context) (*mux.Stream, error) {
		c, err := r.dial(ctx, g)
		if err != nil {
			return nil, err
		}
		c.h1.Store(&g.h1)
		return c.Stream, nil
	}
	g.h1.Reuse = r.h.reusable
	g.h1.Ended = r.h.forget
	if g.svc.H2C {
		g.h2 = r.h2Transport(g)
	}
	return g
}

// h2Transport is net/http's HTTP/2 client with prior knowledge over
// streams, for an h2c service; idle connections are bounded as package
// h1 bounds its streams.
func (r *route) h2Transport(g *generation) *http.Transport {
	t := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return r.dial(ctx, g) },
		MaxIdleConnsPerHost: h1.MaxIdle,
		IdleConnTimeout:     h1.IdleTimeout,
		DisableCompression:  true,
		Protocols:           new(http.Protocols),
	}
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}

// closeIdle closes the pooled idle streams; with stop, the HTTP/1.1
// client pools none from now on (the generation was replaced or the
// route closed).
func (g *generation) closeIdle(stop bool) {
	g.h1.CloseIdle(stop)
	if g.h2 != nil {
		g.h2.CloseIdleConnections()
	}
}

// current returns the client for the service as last announced, learning
// the announcement first with a stream kept for the next dial.
func (r *route) current(ctx context.Context) (*generation, bool, error) {
	r.mu.Lock()
	if time.Now().Before(r.unavailable) {
		r.mu.Unlock()
		return nil, false, fmt.Errorf("%w: device %q at relay %s", ErrUnavailable, r.device, r.h.id)
	}
	if g := r.gen; g != nil {
		retiring := r.retiringLocked()
		r.mu.Unlock()
		return g, retiring, nil
	}
	r.mu.Unlock()
	c, k, err := r.h.open(ctx, r.device)
	r.mu.Lock()
	if err != nil {
		r.noteLocked(err)
		r.mu.Unlock()
		return nil, false, err
	}
	if r.closed {
		r.mu.Unlock()
		c.Close()
		return nil, false, fmt.Errorf("%w: this relay is stopping", ErrUnavailable)
	}
	var stale *generation
	if r.gen == nil || !bytes.Equal(r.gen.raw, k.raw) {
		stale = r.replaceLocked(k)
	}
	old := r.spare
	c.r.Store(r)
	r.spare = c
	g, retiring := r.gen, r.retiringLocked()
	r.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if stale != nil {
		stale.closeIdle(true)
	}
	return g, retiring, nil
}

// noteLocked remembers a holder that serves no stream to the device.
func (r *route) noteLocked(err error) {
	if errors.Is(err, ErrUnavailable) {
		r.unavailable = time.Now().Add(r.h.f.cfg.UnavailableFor)
	}
}

// replaceLocked makes the client for the announcement k current and
// returns the one it replaces, whose idle streams the caller closes once
// it has let go of the lock (closing a stream takes it).
func (r *route) replaceLocked(k *generationKey) *generation {
	old := r.gen
	r.gen = r.newGeneration(k)
	return old
}

// dial opens a connection for g's clients: the spare stream, else a
// new one. A stream whose announcement is not g's is refused as unopened,
// and the announcement becomes current, so that the request is sent again
// rewritten for it.
func (r *route) dial(ctx context.Context, g *generation) (*conn, error) {
	r.mu.Lock()
	if c := r.spare; c != nil && g == r.gen {
		r.spare = nil
		r.mu.Unlock()
		return c, nil
	}
	r.mu.Unlock()
	c, k, err := r.h.open(ctx, r.device)
	if err != nil {
		r.mu.Lock()
		r.noteLocked(err)
		r.mu.Unlock()
		return nil, err
	}
	if !bytes.Equal(k.raw, g.raw) {
		c.Close()
		r.mu.Lock()
		var stale *generation
		if r.gen == g {
			stale = r.replaceLocked(k)
		}
		r.mu.Unlock()
		if stale != nil {
			stale.closeIdle(true)
		}
		return nil, &mux.OpenError{Err: errors.New("the device's agent announced its HTTP service anew")}
	}
	c.r.Store(r)
	return c, nil
}

// roundTrip sends req over the device's client.
func (r *route) roundTrip(req *http.Request) (*http.Response, error) {
	g, retiring, err := r.current(req.Context())
	if err != nil {
		return nil, err
	}
	if req.Method == http.MethodGet && slices.Contains(g.svc.Broadcast, req.URL.Path) {
		// The holder fetches a shared stream once for the fleet.
		return nil, fmt.Errorf("%w: %s is shared by the device's viewers", ErrUnavailable, req.URL.Path)
	}
	out := g.svc.Outgoing(req, g.path)
	var body *heldBody
	if req.Body != nil && req.Body != http.NoBody {
		body = &heldBody{ReadCloser: req.Body}
		out.Body = body
	}
	var resp *http.Response
	if g.h2 != nil && req.Header.Get("Upgrade") == "" {
		if retiring {
			out.Close = true // a retiring connection is not reused after this request
		}
		resp, err = g.h2.RoundTrip(out)
	} else {
		resp, err = g.h1.RoundTrip(out) // a retiring stream is never reused: see holder.reusable
	}
	if err == nil {
		return resp, nil
	}
	if errors.Is(err, ErrUnavailable) && body != nil && body.read.Load() {
		err = &mux.OpenError{Err: err} // cannot happen: a dial that failed read nothing
	}
	return nil, r.mapError(err)
}

// mapError turns the agent's refusal to reach its service, passed on by
// the holder, into a *tunnel.ServiceError; other errors pass through.
func (r *route) mapError(err error) error {
	var re *mux.ResetError
	if errors.As(err, &re) && re.Remote && re.Code >= tunnel.CodeUnknownService && re.Code <= tunnel.CodeServiceUnreachable {
		return &tunnel.ServiceError{Device: r.device, Service: service.Default, Code: re.Code}
	}
	return err
}

// retire counts c, a connection of the HTTP/2 client, as one the holder
// asked to retire, and closes the idle pooled connections until every
// retiring one has closed: a busy one is closed by the HTTP client after
// its request (Connection: close), or here once it is idle.
func (r *route) retire(c *conn) {
	r.mu.Lock()
	if c.closed || c.retiring {
		r.mu.Unlock()
		return
	}
	c.retiring = true
	r.retiring++
	r.retireBy = time.Now().Add(retireWindow)
	start := !r.ticking
	r.ticking = true
	r.mu.Unlock()
	if start {
		r.tick()
	}
}

// retireTick is how often idle pooled streams are closed while some retire.
const retireTick = 20 * time.Millisecond

// retireWindow bounds how long the device's requests ask for their
// streams to close after them while streams retire: one busy for longer (a
// long answer) is closed when it is found idle, looked for every second,
// so that the device's requests do not open a stream each for as long as
// it runs.
const retireWindow = 10 * time.Second

// retiringLocked reports whether streams the holder asked to retire are
// still open and waited for: requests then ask for their stream to close
// after them.
func (r *route) retiringLocked() bool {
	return r.retiring > 0 && time.Now().Before(r.retireBy)
}

// tick closes the idle pooled streams while some retire: every retireTick
// within the window, every second after it.
func (r *route) tick() {
	r.mu.Lock()
	g := r.gen
	again := r.retiring > 0 && !r.closed
	every := retireTick
	if !r.retiringLocked() {
		every = time.Second
	}
	r.ticking = again
	r.mu.Unlock()
	if g != nil {
		g.closeIdle(false)
	}
	if again {
		time.AfterFunc(every, r.tick)
	}
}

func (r *route) close() {
	r.mu.Lock()
	r.closed = true
	g, spare := r.gen, r.spare
	r.spare = nil
	r.mu.Unlock()
	if spare != nil {
		spare.Close()
	}
	if g != nil {
		g.closeIdle(true)
	}
}

// conn is a stream to a device's agent through its holder, as an HTTP
// client holds it. As the version 2 tunnel's streams do, closing it before
// its sending side was half-closed resets it, so that the agent closes its
// connection to the service at once.
type conn struct {
	*mux.Stream
	h  *holder
	r  atomic.Pointer[route]     // set once the stream belongs to a route's client
	h1 atomic.Pointer[h1.Client] // set when that client is the HTTP/1.1 one, which resets the stream itself

	retired    atomic.Bool // the holder asked that it carry no new request
	halfClosed atomic.Bool
	once       sync.Once // Close
	released   sync.Once
	// guarded by r's mu, for the HTTP/2 client's connections:
	retiring bool // the holder asked that it carry no new request
	closed   bool
}

// reusable reports whether st, a stream of an HTTP/1.1 client, may carry
// another request: the holder did not ask to retire it.
func (h *holder) reusable(st *mux.Stream) bool {
	h.mu.Lock()
	c := h.conns[streamKey{st.Session(), st.ID()}]
	h.mu.Unlock()
	return c != nil && !c.retired.Load()
}

// forget drops st, a stream an HTTP/1.1 client ended, from the streams
// the holder may ask to retire.
func (h *holder) forget(st *mux.Stream) {
	h.mu.Lock()
	c := h.conns[streamKey{st.Session(), st.ID()}]
	h.mu.Unlock()
	if c != nil {
		c.release()
	}
}

// CloseWrite half-closes the stream.
func (c *conn) CloseWrite() error {
	c.halfClosed.Store(true)
	return c.Stream.CloseWrite()
}

// Close resets the stream, or closes it after a half-close.
func (c *conn) Close() error {
	var err error
	c.once.Do(func() {
		if c.halfClosed.Load() {
			err = c.Stream.Close()
		} else {
			err = c.Stream.Reset(mux.CodeCancel)
		}
		c.release()
	})
	return err
}

// release forgets the stream, which has ended: the holder's notices no
// longer name it, and it no longer counts as retiring.
func (c *conn) release() {
	c.released.Do(func() {
		c.h.mu.Lock()
		delete(c.h.conns, streamKey{c.Session(), c.ID()})
		c.h.mu.Unlock()
		if r := c.r.Load(); r != nil {
			r.mu.Lock()
			c.closed = true
			if c.retiring {
				r.retiring--
			}
			r.mu.Unlock()
		}
	})
}

// retire marks the stream as one that takes no new request: an idle one
// of the HTTP/1.1 client is reset now, a busy one at its exchange's end.
func (c *conn) retire() {
	c.retired.Store(true)
	if hc := c.h1.Load(); hc != nil {
		hc.Evict(c.Stream)
		return
	}
	if r := c.r.Load(); r != nil {
		r.retire(c)
	}
}

// heldBody is a request body that the HTTP client may close without
// closing the user's body when it read nothing of it (a dial that
// failed): the request can then go over HTTP with its body whole.
type heldBody struct {
	io.ReadCloser
	read atomic.Bool
}

func (b *heldBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.ReadCloser.Read(p)
}

func (b *heldBody) Close() error {
	if b.read.Load() {
		return b.ReadCloser.Close()
	}
	return nil
}
