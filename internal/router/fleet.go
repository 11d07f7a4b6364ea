package router

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/forward"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/replay"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// Fleet routes a user request to its device wherever in the fleet the
// device is held: through this relay's own agents when it has them (or is
// the holder and waits for one), else one hop to the holder, signed with the
// peer secret so that the holder trusts this relay's check of the user.
// A forward that cannot reach the holder, or loses its connection to it,
// vetoes it at once and goes to the next relay in the ranking; a request
// lost on the way (see decide) goes there only when it may be repeated.
//
// The fields are what it reads and tells; all but Spend and Observer are
// required.
type Fleet struct {
	Local *Local
	// Directory says where a request goes, leaving out the relays this
	// relay must not forward to.
	Directory Directory
	// Registry says whether the fleet has seen the device: a request for a
	// device never seen answers 503 at once instead of waiting Grace.
	Registry Registry
	// Agents says whether this relay has an agent for the device now.
	Agents Agents
	// Status says whether this relay drains or stops (see next).
	Status Status
	Signer *peer.Signer
	// Vetoer takes a relay out of routing after a connection to it failed.
	Vetoer Vetoer
	// Changes wakes a request waiting for its device's agent.
	Changes Changes
	// Grace is how long a request for a device with no agent anywhere
	// waits for one to connect, here or at another relay.
	Grace time.Duration
	// Spend, if set, records the use of the access code whose ticket a
	// request carries, just before the request is handed to the device's
	// agent here, and refuses a code used before: the relay holding a
	// device enforces the single use of codes. Forwards carry the ticket on.
	Spend Spender
	// Observer, if set, is told of each forward's outcome.
	Observer ForwardObserver
	// Streams, if set, carries forwards to holders that have a version 2
	// agent of the device as streams spliced onto the agent's tunnel; the
	// rest, and requests with an access code's ticket (which the holder
	// spends as it hands the request over), go over HTTP.
	Streams StreamForwarder
	Logger  *slog.Logger

	peers http.RoundTripper // in tests, instead of the three below
	h2    *http.Transport   // http:// peers, HTTP/2 with prior knowledge: streams, trailers
	h2tls *http.Transport   // https:// peers, HTTP/2 by ALPN (HTTP/1.1 if that is all a peer offers)
	h1    *http.Transport   // peers, HTTP/1.1: upgrades
}

// NewFleet returns a Fleet router with pooled peer connections; fill in its
// fields before use. peerTLS verifies the relays advertised at https://
// URLs; nil verifies them against the system roots.
func NewFleet(peerTLS *tls.Config) *Fleet {
	if peerTLS == nil {
		peerTLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	dialer := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}
	transport := func(p func(*http.Protocols)) *http.Transport {
		t := &http.Transport{
			DialContext:         dialer.DialContext,
			TLSClientConfig:     peerTLS.Clone(), // each transport sets its own ALPN protocols
			TLSHandshakeTimeout: 5 * time.Second,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			Protocols:           new(http.Protocols),
			DisableCompression:  true,
		}
		p(t.Protocols)
		return t
	}
	h2 := transport(func(p *http.Protocols) { p.SetUnencryptedHTTP2(true) })
	h2tls := transport(func(p *http.Protocols) { p.SetHTTP2(true); p.SetHTTP1(true) })
	h1 := transport(func(p *http.Protocols) { p.SetHTTP1(true) })
	h1.TLSClientConfig.NextProtos = []string{"http/1.1"} // an upgrade needs HTTP/1.1
	h1.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		// The body of an upgrade's 101 reads this connection: an empty read
		// of it waits for bytes, so that the relay's copy of an idle
		// websocket to the user holds no buffer (mux.Copy).
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return mux.WaitingConn(c), nil
	}
	return &Fleet{h2: h2, h2tls: h2tls, h1: h1}
}

// Close drops the idle peer connections.
func (f *Fleet) Close() {
	f.h2.CloseIdleConnections()
	f.h2tls.CloseIdleConnections()
	f.h1.CloseIdleConnections()
}

// transport returns the peer transport for a request to a relay at a URL
// of scheme: HTTP/1.1 for upgrades (websockets, SPDY), else HTTP/2.
func (f *Fleet) transport(scheme string, upgrade bool) http.RoundTripper {
	switch {
	case f.peers != nil:
		return f.peers
	case upgrade:
		return f.h1
	case scheme == "https":
		return f.h2tls
	default:
		return f.h2
	}
}

// MaxHops bounds how often a request is forwarded between relays: once to
// the holder, and once more when the device moved away from that holder
// while the request was on its way.
const MaxHops = 2

// maxUnsent bounds the attempts of a request that found no agent here to
// take it, which RoundTrip does not count against its four: each waits for
// a change of the fleet or of this relay's agents (presence).
const maxUnsent = 16

// RoundTrip implements http.RoundTripper for requests whose URL host is the
// device name. A failed attempt is followed as decide says: a request that
// never left goes elsewhere, one lost on the way to the device (its
// holder, or its agent's tunnel here, died before answering) is sent once
// more to wherever the device is now when it may be repeated.
func (f *Fleet) RoundTrip(req *http.Request) (*http.Response, error) {
	device := req.URL.Host
	hops, _ := peer.Forwarded(req.Context())
	exclude := ""
	ticket, carry := access.TicketFrom(req.Context())
	spend := carry && f.Spend != nil
	var st attempts
	req = noteInformed(req, &st.informed)
	here := presence{agents: f.Agents, device: device}
	unsent := 0 // attempts here that found no agent to take the request
	for tries := 0; tries < 4; tries++ {
		if here.has() {
			if spend {
				if err := f.Spend.Spend(ticket); err != nil {
					return nil, err
				}
				spend, carry = false, false // spent here: no other relay spends it again
			}
			changed := f.Changes.Changed()
			resp, err := f.Local.RoundTrip(req)
			switch {
			case undispatched(err):
				// The agent left between the check and the dispatch, and
				// nothing was sent: look again in the fleet, and here
				// after the next change (a tunnel that is closing may
				// still count as ready until the pool removes it).
				here.doubt = changed
				if unsent < maxUnsent {
					unsent++
					tries-- // nothing was sent: not an attempt
				}
			case err != nil && decide(replay.Classify(err), req, &st, true) == replayElsewhere:
				st.replayed = true // to another agent here, or wherever the device went
				continue
			default:
				return resp, err
			}
		}
		t, ok := f.next(device, exclude, here.has())
		if !ok || t.Self || t.Address == "" || hops >= MaxHops {
			if !f.known(device) {
				return nil, broker.NoAgentError(device)
			}
			if t, ok = f.await(req.Context(), &here, exclude, hops); !ok {
				return nil, broker.NoAgentError(device)
			}
			if t.Self {
				continue
			}
		}
		next := hops + 1
		if t.Final {
			next = MaxHops // wait there for the agent, do not go on
		}
		var tk *access.Ticket
		if carry {
			tk = &ticket
		}
		resp, err := f.forward(req, device, t, next, tk)
		if f.Observer != nil {
			f.Observer.Forwarded(t.ID, err)
		}
		if err == nil {
			return resp, nil
		}
		fail := replay.Classify(err)
		if fail == replay.Refused || fail == replay.Lost {
			// The holder refused the connection or dropped it: take it out
			// of routing now rather than after the watchdog's probes.
			f.Vetoer.Veto(t.ID, err)
		}
		switch decide(fail, req, &st, false) {
		case again:
			// A new connection to the holder died before it carried the
			// request: the holder may be fine (one busy taking a drain's
			// agents). Try once more.
			st.reopened = true
		case elsewhere:
			exclude = t.ID
		case replayElsewhere:
			st.replayed = true
			exclude = t.ID
		default:
			return nil, err
		}
	}
	return nil, broker.NoAgentError(device)
}

// next returns the relay a request for device goes to, leaving out
// exclude: the directory's route, except on a relay that leaves the fleet
// (it drains or stops) for a device whose agent has gone from here while
// the directory still names this relay: the request then goes to where the
// agent is being placed, before the directory says so, and is marked Final
// to wait there for the agent rather than go on. here says whether this
// relay has an agent of the device.
func (f *Fleet) next(device, exclude string, here bool) (fleet.Target, bool) {
	t, ok := f.Directory.Route(device, exclude)
	if ok && t.Self && leaving(f.Status) && !here && !f.Agents.Remembers(device) {
		if h, hok := f.Directory.Holder(device, exclude); hok && !h.Self {
			h.Final = true
			return h, true
		}
	}
	return t, ok
}

// known reports whether device had an agent in the fleet, or a long-poll
// agent here that is between polls.
func (f *Fleet) known(device string) bool {
	return f.Registry.Known(device) || f.Agents.Remembers(device)
}

// HasAgent reports whether this relay has an agent of device that takes
// requests now.
func (f *Fleet) HasAgent(device string) bool { return f.Agents.HasAgent(device) }

// action is what RoundTrip does after an attempt failed.
type action uint8

const (
	giveUp          action = iota // the error goes to the user
	again                         // the same holder once more: nothing was sent
	elsewhere                     // the ranking's next choice: nothing was sent
	replayElsewhere               // once more, wherever the device is now: it may have been sent
)

// attempts is what a request has spent of its second chances.
type attempts struct {
	reopened bool        // sent again after a new connection closed unused
	replayed bool        // sent again after it was lost on the way
	informed atomic.Bool // a 1xx answer went on to the user
}

// decide says what follows an attempt that failed so, local when the
// attempt went to this relay's own agents. A request that never left moves
// (its body rewound); one that may have reached the device moves once, and
// only when it may be repeated (replay.Repeatable) and its user has had no
// byte of an answer: a response already under way is never replayed, which
// RoundTrip ensures by deciding only failures without a response, and a
// 1xx passed on counts. Anything else — a cancelled user, a bad request,
// an error not of the connection — is the user's answer.
func decide(fail replay.Failure, req *http.Request, st *attempts, local bool) action {
	switch {
	case fail.Sent():
		if st.replayed || st.informed.Load() || !replay.Repeatable(req) {
			return giveUp
		}
		return replayElsewhere
	case local:
		return giveUp // the tunnel pool has moved what was not sent
	case fail == replay.Unopened && !st.reopened && replay.Rewind(req):
		return again
	case fail == replay.Refused && replay.Rewind(req):
		return elsewhere
	}
	return giveUp
}

// noteInformed returns req with a trace that sets informed when an
// informational (1xx) answer arrives, which the reverse proxy passes on to
// the user.
func noteInformed(req *http.Request, informed *atomic.Bool) *http.Request {
	trace := &httptrace.ClientTrace{Got1xxResponse: func(int, textproto.MIMEHeader) error {
		informed.Store(true)
		return nil
	}}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
}

// undispatched reports whether err means that no agent was there to take
// the request and nothing of it was sent.
func undispatched(err error) bool {
	return errors.Is(err, tunnel.ErrNoSession) || errors.Is(err, broker.ErrDraining) ||
		errors.Is(err, broker.ErrNoAgent) && !errors.Is(err, broker.ErrPickup)
}

// await waits for the device to get an agent here (Self) or to be found at
// another relay that the request may still go to, up to Grace over all of
// a request's waits.
func (f *Fleet) await(ctx context.Context, here *presence, exclude string, hops int) (fleet.Target, bool) {
	if here.until.IsZero() {
		here.until = time.Now().Add(f.Grace) // one Grace for all of a request's waits
	}
	timer := time.NewTimer(time.Until(here.until))
	defer timer.Stop()
	for {
		changed := f.Changes.Changed()
		has := here.has()
		if has {
			return fleet.Target{Self: true}, true
		}
		if t, ok := f.next(here.device, exclude, has); ok && !t.Self && t.Address != "" && hops < MaxHops {
			return t, true
		}
		select {
		case <-changed:
		case <-timer.C:
			return fleet.Target{}, false
		case <-ctx.Done():
			return fleet.Target{}, false
		}
	}
}

// presence is what a request believes of this relay's agent of its
// device: Agents.HasAgent, except that after an attempt found no agent here
// to take it, none is believed here until the next change of this relay's
// agents or of the fleet (doubt closes). Otherwise a tunnel that still
// counts as ready while it closes would spend the request's attempts in a
// moment, and answer 503 while the device's agent is on its way elsewhere.
type presence struct {
	agents Agents
	device string
	doubt  <-chan struct{}
	until  time.Time // when the request's wait for an agent ends (await)
}

func (p *presence) has() bool {
	if p.doubt != nil {
		select {
		case <-p.doubt:
			p.doubt = nil
		default:
			return false
		}
	}
	return p.agents.HasAgent(p.device)
}

// forward sends req to the relay t as /client/<device>/<path>, as its
// hops-th hop.
// A ticket, when given, goes along for the relay that hands the request to
// the device to spend.
func (f *Fleet) forward(req *http.Request, device string, t fleet.Target, hops int, ticket *access.Ticket) (*http.Response, error) {
	if f.Streams != nil && ticket == nil {
		resp, err := f.Streams.RoundTrip(req, t.ID, t.Address)
		var se *tunnel.ServiceError
		switch {
		case err == nil:
			return resp, nil
		case errors.As(err, &se), errors.Is(err, tunnel.ErrBusy):
			return nil, err // the holder answered: the agent could not reach its service, or the device is busy
		case !errors.Is(err, forward.ErrUnavailable):
			return nil, &forwardError{relay: t.ID, err: err}
		}
	}
	base, err := url.Parse(t.Address)
	if err != nil {
		return nil, fmt.Errorf("relay %s advertises %q: %w", t.ID, t.Address, err)
	}
	out := req.Clone(req.Context())
	out.URL = &url.URL{
		Scheme:   base.Scheme,
		Host:     base.Host,
		Path:     "/client/" + device + req.URL.Path,
		RawQuery: req.URL.RawQuery,
	}
	if req.URL.RawPath != "" {
		out.URL.RawPath = "/client/" + device + req.URL.RawPath
	}
	out.Host = req.Host
	out.RequestURI = ""
	f.Signer.Sign(out.Header, device)
	out.Header.Set(peer.HopsHeader, strconv.Itoa(hops))
	if ticket != nil {
		ticket.SetHeader(out.Header)
	}
	resp, err := f.transport(base.Scheme, out.Header.Get("Upgrade") != "").RoundTrip(out)
	if err != nil {
		return nil, &forwardError{relay: t.ID, err: err}
	}
	return resp, nil
}

// forwardError is a forward that got no answer from the holder.
type forwardError struct {
	relay string
	err   error
}

func (e *forwardError) Error() string {
	return fmt.Sprintf("relay %s, which holds the device, did not answer: %v", e.relay, e.err)
}
func (e *forwardError) Unwrap() error { return e.err }

// HTTPStatus makes a failed forward a 502 for the user.
func (e *forwardError) HTTPStatus() int { return http.StatusBadGateway }

// ProxyTo returns a handler that forwards an agent's call about device, as
// it is, to the relay t, signed so that t serves it rather than forwarding
// it again. Long-poll agents may poll any relay; their calls all meet at
// the device's holder.
func (f *Fleet) ProxyTo(t fleet.Target, device string) http.Handler {
	base, err := url.Parse(t.Address)
	if err != nil || base.Host == "" {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, fmt.Sprintf("relay %s, which holds the device, advertises no usable address", t.ID), http.StatusBadGateway)
		})
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
			pr.Out.Host = pr.In.Host
			f.Signer.Sign(pr.Out.Header, device)
		},
		Transport:     f.transport(base.Scheme, false),
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			if replay.Classify(err) == replay.Refused {
				f.Vetoer.Veto(t.ID, err)
			}
			http.Error(w, fmt.Sprintf("relay %s, which holds the device, did not answer: %v", t.ID, err), http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(f.logger().Handler(), slog.LevelDebug),
	}
}

func (f *Fleet) logger() *slog.Logger {
	if f.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return f.Logger
}
