// Package relay serves a relay's public listener: it finds the device each
// user request is for, checks the user's credential, and forwards the request
// through a transport (the long-poll broker) with httputil.ReverseProxy; the
// agent endpoints under /server/ go to the agent handler. It knows nothing of
// listeners, TLS or NATS.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/httperr"
	"github.com/switchboard-relay/switchboard/internal/peer"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// UserAuthorizer decides whether the user making r may use the device of
// t, the parsed address of r (ParseTarget). It returns
// an error carrying an HTTP status (401 or 403) via an HTTPStatus() int
// method when not. It need not remove the credential it read: every
// credential the relay understands is taken off the request before it
// leaves (StripCredentials), whichever one was used. It returns the
// request to go on with: r, or r with a context carrying what the
// credential implies (an access code's ticket, a response hook).
type UserAuthorizer func(r *http.Request, t Target) (*http.Request, error)

// Config configures the public handler.
type Config struct {
	// Transport carries a request to the device named by its URL's host. Required.
	Transport http.RoundTripper
	// Agents serves the long-poll agent endpoints under /server/. Required.
	Agents http.Handler
	// Tunnels serves the native tunnel endpoints under /switchboard/. Required.
	Tunnels http.Handler
	// AuthorizeUser checks users; nil lets everyone in.
	AuthorizeUser UserAuthorizer
	// VerifyPeer checks the signature of a request another relay forwarded,
	// returning the forwarding relay's id, or an error wrapping
	// peer.ErrNoSignature when the request carries none. A forwarded request
	// skips AuthorizeUser (the forwarding relay checked the user). Nil
	// accepts no forwards.
	VerifyPeer func(r *http.Request, device string) (relayID string, err error)
	// Ready reports whether the relay takes new work; nil means always.
	Ready func() bool
	// StallTimeout cuts a request when no byte moved either way for this
	// long while the relay waited on the client (see GuardIdle). Zero or
	// less: never.
	StallTimeout time.Duration
	// Detach returns the context an upgraded connection (a websocket)
	// lives under once the handler that switched it has returned, from
	// the request's, and a func that ends it, called when the connection
	// ends. The context must end when what let the request in is
	// withdrawn (auth.Sessions.Detach: a revoked token). Nil: a context
	// that ends only with the connection.
	Detach func(ctx context.Context) (context.Context, context.CancelFunc)
	// Logger receives the handler's logs; nil discards them.
	Logger *slog.Logger
}

// Handler is the public listener's handler.
type Handler struct {
	cfg   Config
	proxy *httputil.ReverseProxy

	mu     sync.Mutex
	active int           // user requests being served, upgraded streams included
	idle   chan struct{} // closed when active drops to 0; nil while it is 0
}

// track counts a user request until the returned func is called. Upgraded
// streams (websockets) count until they end: http.Server.Shutdown does not
// wait for them, as their connections are hijacked.
func (h *Handler) track() func() {
	h.mu.Lock()
	h.active++
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.active--; h.active == 0 && h.idle != nil {
			close(h.idle)
			h.idle = nil
		}
	}
}

// WaitIdle returns when no user request or stream is being served, or with
// ctx's error when ctx ends first.
func (h *Handler) WaitIdle(ctx context.Context) error {
	h.mu.Lock()
	if h.active == 0 {
		h.mu.Unlock()
		return nil
	}
	if h.idle == nil {
		h.idle = make(chan struct{})
	}
	idle := h.idle
	h.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// targetKey keys a request's routed in its context.
type targetKey struct{}

// routed is where the handler sends a request, and from which relay it
// came ("" for a user's own): rewrite reads both in one look-up.
type routed struct {
	Target
	from string
}

// NewHandler returns the public handler.
func NewHandler(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg}
	h.proxy = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      cfg.Transport,
		ModifyResponse: modifyResponse,
		BufferPool:     bufferPool{},
		ErrorHandler:   h.proxyError,
		ErrorLog:       slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w, r, unguard := guardIdle(w, r, h.cfg.StallTimeout)
	defer unguard()
	closeIfChunked(w, r)
	t, named, err := ParseTarget(r.URL, r.Header)
	switch {
	case err != nil:
		writeError(w, err)
		return
	case !named:
		h.serveLocal(w, r)
		return
	case !t.ByPath && isLocalPath(r.URL.Path):
		// In header mode the relay's own paths are never forwarded.
		h.serveLocal(w, r)
		return
	}
	from, err := h.verifyPeer(r, t.Device)
	if err != nil {
		textError(w, http.StatusUnauthorized, err.Error())
		return
	}
	// Only a forwarding relay vouches for an access code's use.
	ticket, hasTicket := access.ParseTicket(r.Header.Get(access.TicketHeader))
	r.Header.Del(access.TicketHeader)
	if from != "" {
		hops, _ := strconv.Atoi(r.Header.Get(peer.HopsHeader))
		ctx := peer.WithForwarded(r.Context(), from, max(hops, 1))
		if hasTicket {
			ctx = access.WithTicket(ctx, ticket)
		}
		r = r.WithContext(ctx)
	} else if h.cfg.AuthorizeUser != nil {
		if r, err = h.cfg.AuthorizeUser(r, t); err != nil {
			writeError(w, err)
			return
		}
	}
	stripH2CUpgrade(r.Header)
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &userBody{ReadCloser: r.Body}
	}
	r = r.WithContext(context.WithValue(r.Context(), targetKey{}, routed{Target: t, from: from}))
	untrack := h.track()
	if proto := upgradeType(r.Header); proto != "" {
		var u *upgrade
		u, w, r = h.newUpgrade(w, r, proto, untrack)
		defer u.handlerDone()
	} else {
		defer untrack()
	}
	h.proxy.ServeHTTP(w, r)
}

// ForwardedFrom returns the id of the relay that forwarded the request of
// ctx, or "" when a user sent it here directly.
func ForwardedFrom(ctx context.Context) string {
	_, from := peer.Forwarded(ctx)
	return from
}

// Hops returns how often the request of ctx was forwarded between relays
// to get here, and by which relay last; 0 and "" when a user sent it here.
func Hops(ctx context.Context) (int, string) { return peer.Forwarded(ctx) }

// verifyPeer checks a forwarded request's signature and removes it, so
// that it never reaches the device. It returns "" for a request that is
// not forwarded.
func (h *Handler) verifyPeer(r *http.Request, device string) (string, error) {
	if r.Header.Get(peer.Header) == "" {
		return "", nil
	}
	defer r.Header.Del(peer.Header)
	defer r.Header.Del(peer.HopsHeader)
	if h.cfg.VerifyPeer == nil {
		return "", errors.New("this relay accepts no forwarded requests")
	}
	from, err := h.cfg.VerifyPeer(r, device)
	if err != nil {
		return "", fmt.Errorf("a forward from another relay was refused: %w", err)
	}
	return from, nil
}

// isLocalPath reports whether path is one of the relay's own.
func isLocalPath(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics" ||
		strings.HasPrefix(path, "/server/") || strings.HasPrefix(path, "/switchboard/")
}

// serveLocal serves the relay's own paths on the public listener.
func (h *Handler) serveLocal(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, "/server/"):
		h.cfg.Agents.ServeHTTP(w, r)
	case strings.HasPrefix(r.URL.Path, "/switchboard/"):
		h.cfg.Tunnels.ServeHTTP(w, r)
	case r.URL.Path == "/healthz":
		io.WriteString(w, "ok\n")
	case r.URL.Path == "/readyz":
		if h.cfg.Ready != nil && !h.cfg.Ready() {
			textError(w, http.StatusServiceUnavailable, "draining")
			return
		}
		io.WriteString(w, "ready\n")
	default:
		textError(w, http.StatusBadRequest, "no device named: use /client/<device>/<path> or the X-Server-Name header")
	}
}

// rewrite points the outgoing request at the device: the URL's host is the
// device name, which the transport reads.
func rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(targetKey{}).(routed)
	t := rt.Target
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = t.Device
	out.URL.Opaque = "" // ParseTarget accepts none; never pass one on
	out.URL.Path = t.Path
	out.URL.RawPath = t.RawPath
	out.Host = pr.In.Host
	StripCredentials(out.Header, out.URL) // on every relay, forwarded requests too
	if rt.from == "" {
		pr.SetXForwarded()
		return
	}
	// Forwarded by the relay the user reached: keep what that relay saw of
	// the user, and add that relay as the last hop.
	out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
	pr.SetXForwarded()
	if v := pr.In.Header.Get("X-Forwarded-Proto"); v != "" {
		out.Header.Set("X-Forwarded-Proto", v)
	}
}

// copyBuffers recycles the reverse proxy's copy buffers.
var copyBuffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// bufferPool is an httputil.BufferPool over copyBuffers.
type bufferPool struct{}

func (bufferPool) Get() []byte  { return copyBuffers.Get().(*[32 << 10]byte)[:] }
func (bufferPool) Put(b []byte) { copyBuffers.Put((*[32 << 10]byte)(b)) }

type responseHookKey struct{}

// WithResponseHook returns ctx carrying fn, which the handler calls on the
// device's response before passing it to the user (to set a cookie).
func WithResponseHook(ctx context.Context, fn func(*http.Response)) context.Context {
	return context.WithValue(ctx, responseHookKey{}, fn)
}

// modifyResponse prepares the device's response for the user, and takes
// an upgraded connection over (see upgrade).
func modifyResponse(resp *http.Response) error {
	ctx := resp.Request.Context()
	if fn, ok := ctx.Value(responseHookKey{}).(func(*http.Response)); ok {
		fn(resp)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if u, ok := ctx.Value(upgradeKey{}).(*upgrade); ok {
			return u.take(resp)
		}
	}
	return promoteGRPC(resp)
}

// grpcStatusHeaders are the fields a gRPC "trailers-only" answer carries.
var grpcStatusHeaders = []string{"Grpc-Status", "Grpc-Message", "Grpc-Status-Details-Bin"}

// promoteGRPC moves the status fields of a gRPC "trailers-only" answer —
// which arrives as headers over the long-poll protocol and from some
// backends — into the trailers, where gRPC clients require them. Other
// Grpc-* headers (Grpc-Encoding) stay headers.
func promoteGRPC(resp *http.Response) error {
	if resp.Header.Get("Grpc-Status") == "" {
		return nil
	}
	for _, k := range grpcStatusHeaders {
		vv := resp.Header[k]
		if len(vv) == 0 {
			continue
		}
		if resp.Trailer == nil {
			resp.Trailer = make(http.Header)
		}
		resp.Trailer[k] = append(resp.Trailer[k], vv...)
		delete(resp.Header, k)
	}
	return nil
}

// stripH2CUpgrade drops an "Upgrade: h2c" offer: the relay serves HTTP/2
// cleartext with prior knowledge only (RFC 9113 deprecated the upgrade), and a
// client offering it carries on with HTTP/1.1 when it is ignored.
func stripH2CUpgrade(h http.Header) {
	if !strings.EqualFold(h.Get("Upgrade"), "h2c") {
		return
	}
	h.Del("Upgrade")
	h.Del("Http2-Settings")
	var keep []string
	for _, v := range h.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			tok = strings.TrimSpace(tok)
			if tok != "" && !strings.EqualFold(tok, "upgrade") && !strings.EqualFold(tok, "http2-settings") {
				keep = append(keep, tok)
			}
		}
	}
	h.Del("Connection")
	if len(keep) > 0 {
		h.Set("Connection", strings.Join(keep, ", "))
	}
}

// proxyError answers a failed forward with the error's own status.
func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errUpgraded) {
		return // the connection was handed over after the 101
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the user went away
	}
	h.cfg.Logger.Debug("forward failed", logkey.Device, r.URL.Host, logkey.Err, err)
	if be := (*BodyError)(nil); errors.As(err, &be) {
		// The user's request failed, whatever the transport wrapped
		// around it; its framing is broken, so its connection goes too.
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		err = be
	}
	writeError(w, err)
}

// writeError answers a failed request with the status its error carries,
// or 502 for a forward that failed without saying why.
func writeError(w http.ResponseWriter, err error) {
	if !httperr.Has(err) {
		err = httperr.New(http.StatusBadGateway, fmt.Sprintf("forwarding failed: %v", err))
	}
	httperr.Write(w, err)
}

func textError(w http.ResponseWriter, status int, msg string) { httperr.Text(w, status, msg) }
