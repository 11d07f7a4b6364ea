package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/forward"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/pulse"
	"github.com/switchboard-relay/switchboard/internal/relay"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// connectDeviceHeader names, on a relay's signed forward of connect
// streams, the one device the forward's session may reach: the peer
// signature is made for it.
const connectDeviceHeader = "X-Switchboard-Connect-Device"

// connectGateway serves switchboard connect on the public listener: users'
// sessions, whose streams go to the device's agent here or one hop to the
// relay holding the device, and other relays' signed forwards, whose
// streams go to an agent here and nowhere else.
type connectGateway struct {
	n           *Node
	users, peer *connect.Handler

	mu      sync.Mutex                 // guards the fields below
	clients map[string]*connect.Client // forwards, by holder and device
	closed  bool                       // Close was called: no more forwards
}

func newConnectGateway(n *Node) *connectGateway {
	g := &connectGateway{n: n, clients: map[string]*connect.Client{}}
	log := n.log.With(logkey.Component, "connect")
	g.users = &connect.Handler{Open: openerFunc(g.openAnywhere), Authorize: n.authorizeConnect, Conns: n.conns, Logger: log}
	g.peer = &connect.Handler{Open: openerFunc(g.openHere), Authorize: n.authorizeConnectPeer, Logger: log}
	return g
}

// The peer handler's streams are accounted for by the relay the user
// reached: one connection is counted, logged and recorded once.

// ServeHTTP serves one connect session until it ends, the credential that
// opened it is revoked, or the relay stops.
func (g *connectGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// A drain lets sessions run on to its deadline (their streams are TCP
	// connections the drain waits for), and cuts them there.
	stop := context.AfterFunc(g.n.cutTCP, cancel)
	defer stop()
	r = r.WithContext(ctx)
	if r.Header.Get(peer.Header) != "" {
		g.peer.ServeHTTP(w, r)
		return
	}
	g.users.ServeHTTP(w, r)
}

// routeConnect sends switchboard connect's upgrades to the gateway, and
// other relays' stream forwards to the forward server.
func (n *Node) routeConnect(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == connect.Path:
			n.connect.ServeHTTP(w, r)
			return
		case r.URL.Path == forward.Path && !n.cfg.NoStreamForward:
			n.forwards.ServeHTTP(w, r)
			return
		case r.URL.Path == probePath && pulse.IsRequest(r):
			n.pulses.ServeHTTP(w, r) // the other relays' watchdogs
			return
		}
		next.ServeHTTP(w, r)
	})
}

// openerFunc is a function as a connect.Opener.
type openerFunc func(ctx context.Context, t connect.Target) (net.Conn, error)

var _ connect.Opener = openerFunc(nil)

func (f openerFunc) Open(ctx context.Context, t connect.Target) (net.Conn, error) { return f(ctx, t) }

// openHere opens a stream to the service on an agent of the device on this
// relay: a tcp or udp service as t's network says, or for passthrough a
// tcp service that the device's agent offers for it.
func (g *connectGateway) openHere(ctx context.Context, t connect.Target) (net.Conn, error) {
	var conn net.Conn
	var err error
	switch t.Network {
	case "", connect.TCP:
		conn, err = g.n.tunnels.OpenService(ctx, t.Device, t.Service, service.TCP)
	case connect.UDP:
		conn, err = g.n.tunnels.OpenService(ctx, t.Device, t.Service, service.UDP)
	case connect.Passthrough:
		conn, err = g.n.tunnels.OpenPassthrough(ctx, t.Device, t.Service)
	default:
		err = fmt.Errorf("%w: no network %q", connect.ErrUnknownService, t.Network)
	}
	if err != nil {
		return nil, connectError(err)
	}
	return &serviceConn{Conn: conn}, nil
}

// openAnywhere opens a stream here when an agent of the device is here,
// else through the relay that holds the device, one hop.
func (g *connectGateway) openAnywhere(ctx context.Context, t connect.Target) (net.Conn, error) {
	conn, err := g.openHere(ctx, t)
	if !errors.Is(err, connect.ErrNoDevice) {
		return conn, err
	}
	to, ok := g.n.view(g.n.forwardVetoed).Route(t.Device, "")
	if !ok || to.Self || to.Address == "" {
		return nil, err
	}
	c, err := g.client(to.ID, to.Address, t.Device)
	if err != nil {
		return nil, err
	}
	return c.Dial(ctx, t)
}

// client returns the session to the holder for device, made at first use
// and reused by every later stream to the device through that holder.
func (g *connectGateway) client(holder, address, device string) (*connect.Client, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("%w: this relay is stopping", connect.ErrNoDevice)
	}
	key := holder + "\x00" + device
	if c, ok := g.clients[key]; ok {
		return c, nil
	}
	u, err := url.Parse(address)
	if err != nil {
		return nil, fmt.Errorf("%w: relay %s advertises %q: %w", connect.ErrNoDevice, holder, address, err)
	}
	c := connect.NewClient(connect.ClientConfig{
		Relay: u,
		TLS:   g.n.peerTLS,
		Sign: func(h http.Header) {
			h.Set(connectDeviceHeader, device)
			g.n.signer.Sign(h, device)
		},
	})
	g.clients[key] = c
	return c, nil
}

// Close ends the forwards' sessions.
func (g *connectGateway) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for _, c := range g.clients {
		c.Close()
	}
	clear(g.clients)
}

// connectError maps the tunnel's errors to what connect tells the user.
func connectError(err error) error {
	var se *tunnel.ServiceError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, tunnel.ErrNoAgent):
		return fmt.Errorf("%w: %w", connect.ErrNoDevice, err)
	case errors.Is(err, tunnel.ErrUnknownService):
		return fmt.Errorf("%w: %w", connect.ErrUnknownService, err)
	case errors.As(err, &se):
		switch se.Code {
		case tunnel.CodeUnknownService:
			return fmt.Errorf("%w: %w", connect.ErrUnknownService, err)
		case tunnel.CodeServiceRefused:
			return fmt.Errorf("%w: %w", connect.ErrRefused, err)
		}
		return fmt.Errorf("%w: %w", connect.ErrUnreachable, err)
	}
	return err
}

// serviceConn is a stream to an agent's service whose refusals read as
// connect's errors.
type serviceConn struct{ net.Conn }

func (c *serviceConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	return n, connectError(err)
}

func (c *serviceConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	return n, connectError(err)
}

// WriteTo writes what the service sends to w, through the stream's own
// copy, so that the bytes the agent sends while w waits reach w from the
// tunnel's reading goroutine (see mux.Carrier).
func (c *serviceConn) WriteTo(w io.Writer) (int64, error) {
	n, err := mux.Copy(w, c.Conn)
	return n, connectError(err)
}

// WriteStep is WriteTo's copy in steps (see mux.StepWriterTo), so that a
// copy from an idle service waits on a small stack.
func (c *serviceConn) WriteStep(w io.Writer) func() (int, error) {
	return mux.StepsThrough(w, c.Conn, func() (int64, error) { return c.WriteTo(w) }, connectError)
}

// CarriedStream returns the stream to the agent: Write changes only its
// errors.
func (c *serviceConn) CarriedStream() *mux.Stream {
	if cr, ok := c.Conn.(mux.Carrier); ok {
		return cr.CarriedStream()
	}
	return nil
}

// CloseWrite half-closes the stream.
func (c *serviceConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// ServiceScope is the path, under a device, that an access code's scope
// must cover to open the device's service name through switchboard
// connect: a code for "/" opens every service, one for "/.service/ssh"
// the service ssh alone.
func ServiceScope(name string) string { return "/.service/" + name }

// authorizeConnect checks a user's connect session as authorizeUser
// checks an HTTP request: a user (or admin) token, filed under its id so
// that revoking it ends the session, or an access code, or nothing when
// anonymous users are allowed. Each stream's device and service must be
// ones the credential may use: a token scoped to DEVICE/SERVICE reaches
// that service alone.
func (n *Node) authorizeConnect(r *http.Request) (connect.Allow, error) {
	if code, _ := access.TakeCode(r.URL.RawQuery); code != "" {
		return n.authorizeConnectCode(r, code)
	}
	token := relay.UserToken(r.Header)
	if token == "" {
		if n.cfg.AllowAnonymousUsers {
			return func(connect.Target) error { return nil }, nil
		}
		return nil, &connect.StatusError{Code: http.StatusUnauthorized, Msg: "this relay needs a user token or an access code: pass one with --token-file or --code; an operator creates tokens with 'switchboard ctl tokens create --user NAME'"}
	}
	ip, err := n.backoff(r)
	if err != nil {
		return nil, statusOf(err)
	}
	p, err := n.tokens.Authenticate(token)
	n.noteAuth(ip, err)
	if err != nil {
		return nil, statusOf(credentialError(err, "user"))
	}
	if p.Kind == auth.KindAgent {
		return nil, &connect.StatusError{Code: http.StatusForbidden, Msg: "this is an agent token; users need a user token"}
	}
	n.sessions.Bind(r.Context(), p.TokenID)
	return func(t connect.Target) error {
		if !p.AllowsService(t.Device, t.Service) {
			return fmt.Errorf("%w: this token may not use %s", connect.ErrForbidden, t)
		}
		return nil
	}, nil
}

// authorizeConnectCode checks an access code for a connect session: the
// code is spent here, at once (a session is not a request to the device's
// holder, where HTTP spends codes), and the session reaches the code's
// device, the services under its scope, while the token it was issued to
// may. Revoking that token ends the session.
func (n *Node) authorizeConnectCode(r *http.Request, code string) (connect.Allow, error) {
	ip, err := n.backoff(r)
	if err != nil {
		return nil, statusOf(err)
	}
	g, err := access.Decode(n.secrets.VerifyKeys(secret.PurposeCode), access.CodePrefix, code, time.Now())
	n.noteAuth(ip, err)
	if err != nil {
		return nil, &connect.StatusError{Code: http.StatusUnauthorized, Msg: "the access code is not valid (" + reason(err) + "); ask for a new one"}
	}
	if _, ok := n.tokens.Principal(g.TokenID); !ok {
		return nil, &connect.StatusError{Code: http.StatusUnauthorized, Msg: "the token this access code was issued to was revoked"}
	}
	if g.Scope != "/" && !strings.HasPrefix(g.Scope, ServiceScope("")) {
		return nil, &connect.StatusError{Code: http.StatusForbidden, Msg: fmt.Sprintf("this access code opens device %q under %q, which holds no service: ask for a code for %s", g.Device, g.Scope, ServiceScope("NAME"))}
	}
	if err := n.spendConnectCode(r.Context(), g); err != nil {
		return nil, statusOf(err)
	}
	n.sessions.Bind(r.Context(), g.TokenID)
	return func(t connect.Target) error {
		if !g.Allows(t.Device, ServiceScope(t.Service)) {
			return fmt.Errorf("%w: this access code opens device %q under %q only", connect.ErrForbidden, g.Device, g.Scope)
		}
		if p, ok := n.tokens.Principal(g.TokenID); !ok || !p.AllowsService(t.Device, t.Service) {
			return fmt.Errorf("%w: the token this access code was issued to may not use %s", connect.ErrForbidden, t)
		}
		return nil
	}, nil
}

// connectCodesBucket records the access codes connect sessions spent, a
// key per code's nonce, for as long as a code lives: its create-only write
// is what makes a code open one session in the whole fleet, whichever
// relays it is sent to at once.
const connectCodesBucket = "switchboard_connect_codes"

// spendConnectCode spends g's code for a connect session: here, as HTTP
// spends codes (a code used for HTTP already is refused), and fleet-wide
// by a create-only write, which two relays cannot both win.
func (n *Node) spendConnectCode(ctx context.Context, g access.Grant) error {
	if err := n.spendCode(access.Ticket{Nonce: g.Nonce, Expires: g.Expires}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := n.store.ExpiringKeyValue(ctx, connectCodesBucket, access.MaxCodeTTL+time.Minute)
	if err == nil {
		_, err = kv.Create(ctx, g.Nonce, []byte(n.relayID))
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return access.ErrSpent
	case err != nil:
		return &connect.StatusError{Code: http.StatusServiceUnavailable, Msg: fmt.Sprintf("the fleet state is unreachable, so the access code's single use cannot be checked: try again (%v)", err)}
	}
	return nil
}

// authorizeConnectPeer checks another relay's forward of connect streams:
// a peer signature for the one device the forward names, whose streams
// alone it may open.
func (n *Node) authorizeConnectPeer(r *http.Request) (connect.Allow, error) {
	device := r.Header.Get(connectDeviceHeader)
	if device == "" {
		return nil, &connect.StatusError{Code: http.StatusBadRequest, Msg: "a connect forward from another relay names no device (" + connectDeviceHeader + ")"}
	}
	if _, err := n.verifyPeer(r, device); err != nil {
		return nil, &connect.StatusError{Code: http.StatusUnauthorized, Msg: fmt.Sprintf("a connect forward from another relay was refused: %v", err)}
	}
	return func(t connect.Target) error {
		if t.Device != device {
			return fmt.Errorf("%w: this forward was signed for device %q", connect.ErrForbidden, device)
		}
		return nil
	}, nil
}

// statusOf turns an error with an HTTP status into connect's.
func statusOf(err error) error {
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) {
		return &connect.StatusError{Code: hs.HTTPStatus(), Msg: err.Error()}
	}
	return err
}
