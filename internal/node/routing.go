package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/forward"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/pulse"
	"github.com/switchboard-relay/switchboard/internal/router"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
	"github.com/switchboard-relay/switchboard/internal/watchdog"
	"github.com/switchboard-relay/switchboard/internal/wire"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Event types of routing.
const (
	EventRelayVetoed = "relay.vetoed"
	EventVetoCleared = "relay.veto_cleared"
	routingComponent = "routing"
	probePath        = "/healthz"
)

// openRouting sets up what lets any relay serve any device: the peer
// signer (the fleet secret), the watchdog over the other relays, and the
// fleet router that forwards to a device's holder.
func (n *Node) openRouting(ctx context.Context) error {
	// The keeper of the fleet secret keeps it current, from the stored
	// record or --fleet-secret-file: every signature reads it afresh.
	n.secrets = n.fleetSecret.Ring()
	var err error
	if n.signer, err = peer.NewSigner(n.secrets, n.member.ID()); err != nil {
		return err
	}
	probe := &http.Client{Transport: newProbeTransport(n.peerTLS, n.peerConnClosed)}
	n.probeClient = probe
	wc := n.cfg.Watchdog
	wc.Logger = n.log.With(logkey.Component, routingComponent)
	wc.Metrics = n.registry
	wc.Peers = n.watchedPeers
	wc.Probe = func(ctx context.Context, p watchdog.Peer) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(p.Address, "/")+probePath, nil)
		if err != nil {
			return err
		}
		resp, err := probe.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %s", probePath, resp.Status)
		}
		return nil
	}
	wc.Pulse = func(ctx context.Context, p watchdog.Peer, echo func(time.Duration), ended func(error)) (watchdog.Beater, error) {
		c, err := pulse.Dial(ctx, p.Address, n.peerTLS, echo, ended)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	wc.OnVeto = func(id string, after time.Duration, reason error) {
		cause := watchdog.CauseProbes
		if after == 0 {
			cause = watchdog.CauseDataPath
		}
		n.member.Record(fleet.Event{Type: EventRelayVetoed, RelayID: id, DurationMS: float64(after.Microseconds()) / 1000,
			Message: fmt.Sprintf("relay %s vetoed by %s (%s): %v", id, n.member.ID(), cause, reason)})
		n.promoteFrom(id, after)
	}
	wc.OnClear = func(id string) {
		n.member.Record(fleet.Event{Type: EventVetoCleared, RelayID: id, Message: fmt.Sprintf("relay %s answers %s again", id, n.member.ID())})
	}
	n.watchdog = watchdog.New(wc)
	wctx, cancel := context.WithCancel(context.Background())
	n.stopWatchdog = cancel
	n.wg.Go(func() { n.watchdog.Run(wctx) })
	n.wg.Go(func() { n.suggestLoop(wctx) }) // standbys for agents that connected without one

	fr := router.NewFleet(n.peerTLS)
	fr.Local = &router.Local{Native: n.tunnels, LongPoll: n.broker}
	fr.Directory = n.view(n.forwardVetoed)
	fr.Registry = n.member
	fr.Agents = localAgents{tunnels: n.tunnels, broker: n.broker}
	fr.Status = nodeStatus{n}
	fr.Signer = n.signer
	fr.Spend = codeSpender{n}
	fr.Changes = n.changes
	fr.Grace = n.cfg.Broker.NoAgentGrace
	fr.Vetoer = n.watchdog
	fr.Observer = router.NewForwardMetrics(n.registry)
	fr.Logger = n.log
	if !n.cfg.NoStreamForward {
		n.forwarder = forward.NewForwarder(forward.Config{Sign: n.signer.Signature, TLS: n.peerTLS})
		n.forwarder.RegisterMetrics(n.registry)
		fr.Streams = n.forwarder
	}
	n.router = fr
	n.placer = &router.Placer{
		Self:               n.member.ID(),
		Directory:          n.view(n.placeVetoed),
		Ranker:             n.view(n.placeVetoed),
		Status:             nodeStatus{n},
		KeepArrivingAgents: n.cfg.KeepArrivingAgents,
	}
	n.calls = &router.Calls{
		Requests:           fr.Directory,
		Polls:              n.view(n.pollVetoed),
		Owners:             n.member,
		Status:             nodeStatus{n},
		KeepArrivingAgents: n.cfg.KeepArrivingAgents,
	}
	return nil
}

// Compile-time checks that the router's inputs are what node gives it.
var (
	_ router.Directory       = fleetView{}
	_ router.Ranker          = fleetView{}
	_ router.Registry        = (*fleet.Member)(nil)
	_ router.Owners          = (*fleet.Member)(nil)
	_ router.Agents          = localAgents{}
	_ router.Status          = nodeStatus{}
	_ router.Vetoer          = (*watchdog.Watchdog)(nil)
	_ router.Changes         = (*changeHub)(nil)
	_ router.Spender         = codeSpender{}
	_ router.ForwardObserver = (*router.ForwardMetrics)(nil)
	_ router.StreamForwarder = (*forward.Forwarder)(nil)
)

// fleetView is this relay's view of where devices are served, in its
// region, leaving out the relays vetoed says.
type fleetView struct {
	member *fleet.Member
	region string
	vetoed func(id string) bool
}

// view returns the fleet as seen with the relays vetoed says left out.
func (n *Node) view(vetoed func(id string) bool) fleetView {
	return fleetView{member: n.member, region: n.cfg.Region, vetoed: vetoed}
}

func (v fleetView) Route(device, exclude string) (fleet.Target, bool) {
	return v.member.Route(device, v.region, v.vetoed, exclude)
}

func (v fleetView) Holder(device, exclude string) (fleet.Target, bool) {
	return v.member.Holder(device, v.region, v.vetoed, exclude)
}

func (v fleetView) Ranked(device string) []fleet.Target {
	return v.member.Ranked(device, v.region, v.vetoed)
}

// localAgents are this relay's agents: native tunnels and long-poll agents.
type localAgents struct {
	tunnels *tunnel.Pool
	broker  *broker.Broker
}

func (a localAgents) HasAgent(device string) bool {
	return a.tunnels.Ready(device) || a.broker.HasAgent(device)
}

func (a localAgents) Remembers(device string) bool { return a.broker.Remembers(device) }

// nodeStatus says whether the node leaves the fleet.
type nodeStatus struct{ n *Node }

func (s nodeStatus) Draining() bool { return s.n.member.ShouldDrain() }
func (s nodeStatus) Stopping() bool { return s.n.stopping.Load() }

// codeSpender enforces the single use of access codes (spendCode).
type codeSpender struct{ n *Node }

func (c codeSpender) Spend(t access.Ticket) error { return c.n.spendCode(t) }

// probeTransport carries the watchdog's probes over one HTTP/2 connection
// per peer (h2c for http:// peers, by ALPN for https://). A probe that times
// out resets its stream, not the connection, so a slow peer is not also
// asked for a new TCP connection on every probe; a peer frozen or gone
// still misses every probe. closed is told the address of each connection
// that the peer closed (or reset): a relay whose process died.
type probeTransport struct {
	h2c, tls *http.Transport
}

func newProbeTransport(peerTLS *tls.Config, closed func(addr string)) *probeTransport {
	dialer := &net.Dialer{Timeout: time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &closeWatch{Conn: c, closed: func() { closed(addr) }}, nil
	}
	t := func(p func(*http.Protocols)) *http.Transport {
		tr := &http.Transport{
			DialContext:         dial,
			TLSClientConfig:     peerTLS.Clone(), // for peers advertised at https:// URLs
			MaxIdleConnsPerHost: 2,
			DisableCompression:  true,
			Protocols:           new(http.Protocols),
		}
		p(tr.Protocols)
		return tr
	}
	return &probeTransport{
		h2c: t(func(p *http.Protocols) { p.SetUnencryptedHTTP2(true) }),
		tls: t(func(p *http.Protocols) { p.SetHTTP2(true); p.SetHTTP1(true) }),
	}
}

func (t *probeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme == "https" {
		return t.tls.RoundTrip(r)
	}
	return t.h2c.RoundTrip(r)
}

func (t *probeTransport) CloseIdleConnections() {
	t.h2c.CloseIdleConnections()
	t.tls.CloseIdleConnections()
}

// closeWatch is a probe connection that tells, once, when its peer closed
// it: HTTP/2 reads its connection all the time, so that is at once.
type closeWatch struct {
	net.Conn
	once   sync.Once
	closed func()
}

func (c *closeWatch) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.once.Do(c.closed) // not this relay closing it
	}
	return n, err
}

// peerConnClosed asks the watchdog to probe at once the relay at addr
// (host:port), a probe connection to which its peer closed: a relay that
// crashed refuses the probe, and is vetoed without waiting for its misses.
func (n *Node) peerConnClosed(addr string) {
	w := n.watchdog
	if w == nil {
		return
	}
	for _, p := range n.watchedPeers() {
		if u, err := url.Parse(p.Address); err == nil && hostPort(u) == addr {
			w.ProbeSoon(p)
			return
		}
	}
}

// hostPort is u's host and port, the scheme's default port if none.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// watchedPeers are the other relays that beat within the lost window, in
// this relay's view of the fleet: while NATS is away that view is frozen,
// and the watchdog, the only judge of a peer left, keeps watching them all.
func (n *Node) watchedPeers() []watchdog.Peer {
	var out []watchdog.Peer
	for _, r := range n.member.Relays() {
		if r.ID == n.member.ID() || len(r.Addresses) == 0 || n.member.HeartbeatAge(r.LastSeenAt) > n.member.LostWindow() {
			continue
		}
		out = append(out, watchdog.Peer{ID: r.ID, Address: r.Addresses[0]})
	}
	return out
}

// verifyPeer checks a forward from another relay.
func (n *Node) verifyPeer(r *http.Request, device string) (string, error) {
	return n.signer.Verify(r.Header, device)
}

// answering reports whether this relay's watchdog hears from relay id now
// (fleet.Config.Answering); before routing opens it hears from none.
func (n *Node) answering(id string) bool {
	w := n.watchdog
	return w != nil && w.Answering(id)
}

// Vetoed reports whether this relay's watchdog vetoes the relay id now.
func (n *Node) Vetoed(id string) bool { return n.watchdog.Vetoed(id) }

// forwardVetoed reports whether this relay must not forward to relay id:
// its watchdog vetoes it, or id said on its last heartbeat that it does not
// accept the fleet secret this relay signs with, so that a forward would be
// refused with a 401 the user would see. Such a request goes to the next
// relay in the ranking instead, or waits for the device's agent to move.
func (n *Node) forwardVetoed(id string) bool {
	return n.watchdog.Vetoed(id) || n.fleetSecret.Refuses(id)
}

// placeVetoed reports whether no agent should be placed on relay id: its
// watchdog vetoes it, or it runs another fleet secret than the fleet
// (secret parity), so that forwards between it and the others fail. An odd
// relay applies this to itself and sends its arriving agents elsewhere.
func (n *Node) placeVetoed(id string) bool {
	return n.watchdog.Vetoed(id) || n.fleetSecret.Odd(id)
}

// pollVetoed is for long-poll agents' polls, which are both forwarded and
// placed: forwardVetoed or placeVetoed.
func (n *Node) pollVetoed(id string) bool {
	return n.forwardVetoed(id) || n.fleetSecret.Odd(id)
}

// placeAgent places an arriving native agent of device as the placer
// decides (router.Placer.Place), noting how long ago an agent taken here
// lost its previous relay, and where an agent sent on went or that one
// came here (fleet.Member.NoteSent, NoteTaken), so that requests follow
// the agent before the directory records the move.
func (n *Node) placeAgent(r *http.Request, device string) tunnel.Placement {
	p := n.placer.Place(device, router.Arrival{
		Redirected:  r.Header.Get(tunnel.RedirectedHeader) != "",
		Unreachable: r.Header.Get(tunnel.UnreachableHeader),
	})
	switch {
	case router.Here(p):
		n.member.NoteTaken(device)
		n.noteLost(r, device)
		n.nameStandby(&p, device)
	case p.Redirect != "":
		n.member.NoteSent(device, p.Holder)
	}
	return p
}

// routeAgent says where a long-poll agent's call for device belongs: here
// when another relay forwarded it (and signed it), else where the calls
// router says (router.Calls.Route).
func (n *Node) routeAgent(r *http.Request, device, requestID string) http.Handler {
	if r.Header.Get(peer.Header) == "" {
		r.Header.Del(wire.PollEndHeader) // honoured on a signed forward only
	} else {
		_, err := n.signer.Verify(r.Header, device)
		r.Header.Del(peer.Header)
		if err != nil {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "a forward from another relay was refused: "+err.Error(), http.StatusUnauthorized)
			})
		}
		return nil
	}
	c := n.calls.Route(device, requestID)
	switch c.Action {
	case router.Forward:
		return n.router.ProxyTo(c.To, device)
	case router.ForwardPoll:
		return n.forwardPoll(n.router.ProxyTo(c.To, device))
	case router.TurnAway:
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "this relay is shutting down; poll another", http.StatusServiceUnavailable)
		})
	}
	return nil
}

// pollEndGrace is how long a stopping relay waits for the holder to end a
// poll it forwarded before it cuts the forward: a holder that predates
// PollEndHeader never ends it.
const pollEndGrace = 2 * time.Second

// forwardPoll forwards a poll through h so that a shutdown here ends it
// soon without dropping a request: the poll's body stays open, and on
// shutdown it ends, which asks the holder to end the poll (wire.PollEndHeader).
// The holder answers 408, or the request it has just handed the poll, which
// goes on to the agent. Cutting the forward at once instead could lose that
// request between the relays, and it would answer the agent with nothing.
func (n *Node) forwardPoll(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		body, endBody := io.Pipe()
		defer endBody.Close()
		stop := context.AfterFunc(n.stopCtx, func() {
			endBody.Close()
			cut := time.AfterFunc(pollEndGrace, cancel)
			context.AfterFunc(ctx, func() { cut.Stop() })
		})
		defer stop()
		out := r.WithContext(ctx)
		out.Body, out.ContentLength = body, -1
		out.Header.Set(wire.PollEndHeader, "1")
		// Once the holder answers, the body has nothing left to say; ending
		// it lets the HTTP/2 stream finish, which the proxy waits for.
		rw := &answerWatch{ResponseWriter: w, onAnswer: func() { endBody.Close() }}
		h.ServeHTTP(rw, out)
		if !rw.answered && r.Context().Err() == nil {
			// The forward was cut before the holder answered: send the
			// agent on rather than leave it an empty answer.
			w.Header().Set("Retry-After", "1")
			http.Error(w, "this relay is shutting down; poll another", http.StatusServiceUnavailable)
		}
	})
}

// answerWatch notes whether a response was started, and calls onAnswer
// when it is.
type answerWatch struct {
	http.ResponseWriter
	onAnswer func()
	answered bool
}

func (a *answerWatch) answer() {
	if !a.answered {
		a.answered = true
		a.onAnswer()
	}
}

func (a *answerWatch) WriteHeader(code int) {
	a.answer()
	a.ResponseWriter.WriteHeader(code)
}

func (a *answerWatch) Write(p []byte) (int, error) {
	a.answer()
	return a.ResponseWriter.Write(p)
}

func (a *answerWatch) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// changeHub wakes whoever waits for the next change of this relay's agents
// or of the fleet state.
// Changed is read by every request the relay's own agents take, so it
// takes no lock.
type changeHub struct {
	ch atomic.Pointer[chan struct{}]
}

func newChangeHub() *changeHub {
	h := &changeHub{}
	ch := make(chan struct{})
	h.ch.Store(&ch)
	return h
}

// signal wakes the current waiters.
func (h *changeHub) signal() {
	next := make(chan struct{})
	close(*h.ch.Swap(&next)) // each signal closes the channel it replaced
}

// Changed returns a channel closed at the next signal.
func (h *changeHub) Changed() <-chan struct{} { return *h.ch.Load() }

// noteLost passes on how long ago an arriving agent lost its previous
// relay, for the device's move event.
func (n *Node) noteLost(r *http.Request, device string) {
	if ms, err := strconv.ParseInt(r.Header.Get(tunnel.LostHeader), 10, 64); err == nil {
		n.member.NoteLost(device, time.Duration(ms)*time.Millisecond)
	}
}
