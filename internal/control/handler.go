package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/httperr"
	"github.com/switchboard-relay/switchboard/internal/limit"
	"github.com/switchboard-relay/switchboard/internal/topic"
)

// Log attribute keys used by this package.
const (
	attrComponent = "component"
	attrTokenID   = "token_id"
	attrError     = "error"
)

// adminTokenHint tells a person where the admin token is.
const adminTokenHint = "use the admin token in <data>/admin.token on a relay (written on its first start)"

// Config is what the admin listener's handler serves.
type Config struct {
	// Tokens checks the admin bearer token and holds the tokens the API
	// manages. Without it the operator API answers 503.
	Tokens *auth.Store
	// Metrics is served at /metrics. Nil serves an empty registry.
	Metrics *prometheus.Registry
	// Ready reports whether the relay is serving; /readyz answers 503
	// "not ready" while it is false. Nil means always ready.
	Ready func() bool
	// Draining reports whether the relay is draining; /readyz answers 503
	// "draining" while it is true. Nil means never draining.
	Draining func() bool
	// Fleet is the fleet state behind the relays, devices, events and
	// status endpoints. Without it they answer 503.
	Fleet Fleet
	// Secret is the relay's fleet secret, which GET /api/v1/secret shows,
	// the rotation steps change and /api/v1/status summarises. Optional:
	// without it those paths answer 503, and the status has no secret.
	Secret FleetSecret
	// Codes issues single-use access codes (POST /api/v1/codes) for the
	// calling user or admin; nil answers 503.
	Codes CodeIssuer
	// Bind, if set, files each authenticated request under its token, so
	// that revoking the token cuts it (an event follow, say).
	Bind func(ctx context.Context, tokenID string)
	// AuthFailures, if set, backs off client addresses that keep
	// presenting invalid tokens (API and sign-in form): 429 with
	// Retry-After. A valid token is never refused by it. It should be
	// the admin listener's own, so that failures on the public listener
	// do not count against the operator.
	AuthFailures *limit.Limiter
	// Topics, if set, lists the broadcast topics on this relay (GET
	// /api/v1/topics and the admin page); nil lists none.
	Topics func() []topic.Stats
	// Ports, if set, holds the fleet's port mappings (/api/v1/ports); nil
	// answers 503.
	Ports PortStore
	// OwnPorts, if set, returns the ports of this relay's own listeners
	// (public and admin), which no tcp mapping may take: 409.
	OwnPorts func() []int
	// PortConns, if set, counts the TCP connections open through each
	// mapped port on this relay, by port number (the admin page).
	PortConns func() map[int]int
	// Stop, if set, makes the relay drain and stop as on SIGTERM (POST
	// /api/v1/relay/stop, a preStop hook's call); nil answers 503.
	Stop func()
	// Logger receives API failures. Nil discards.
	Logger *slog.Logger
}

type handler struct {
	cfg Config
	log *slog.Logger
}

// NewHandler returns the admin listener's handler: GET /healthz, /readyz and
// /metrics openly, and the operator API under /api/v1/ and Go's profiles
// under /debug/pprof/ for the admin token.
func NewHandler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	h := &handler{cfg: cfg, log: cfg.Logger.With(attrComponent, "control")}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathHealthz, h.healthz)
	mux.HandleFunc("GET "+PathReadyz, h.readyz)
	mux.Handle("GET "+PathMetrics, promhttp.HandlerFor(cfg.Metrics, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}))
	mux.Handle("POST "+PathTokens, h.admin(h.createToken))
	mux.Handle("GET "+PathTokens, h.admin(h.listTokens))
	mux.Handle("DELETE "+PathTokens+"/{id}", h.admin(h.revokeToken))
	mux.Handle("POST "+PathCodes, h.adminOrUser(h.createCode))
	mux.Handle("POST "+PathStop, h.admin(h.stop))
	h.routeFleet(mux)
	h.routeTopics(mux)
	h.routePorts(mux)
	h.routeAdmin(mux)
	// Go's profiles, for the admin token only: they show the relay's
	// internals and a CPU profile costs CPU while it runs.
	mux.Handle("GET "+PathDebugProfiles, h.admin(pprof.Index))
	mux.Handle("GET "+PathDebugProfiles+"profile", h.admin(pprof.Profile))
	mux.Handle("GET "+PathDebugProfiles+"trace", h.admin(pprof.Trace))
	mux.Handle("GET "+PathDebugProfiles+"symbol", h.admin(pprof.Symbol))
	mux.Handle("GET "+PathDebugProfiles+"cmdline", h.admin(pprof.Cmdline))
	return mux
}

func (h *handler) healthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok")
}

func (h *handler) readyz(w http.ResponseWriter, _ *http.Request) {
	switch {
	case h.cfg.Draining != nil && h.cfg.Draining():
		writeText(w, http.StatusServiceUnavailable, "draining")
	case h.cfg.Ready != nil && !h.cfg.Ready():
		writeText(w, http.StatusServiceUnavailable, "not ready")
	default:
		writeText(w, http.StatusOK, "ready")
	}
}

// principalHandler is a handler that knows who is calling.
type principalHandler func(http.ResponseWriter, *http.Request, auth.Principal)

// admin lets a request through to next only with a valid admin bearer token.
func (h *handler) admin(next http.HandlerFunc) http.Handler {
	return h.authorized(false, func(w http.ResponseWriter, r *http.Request, _ auth.Principal) { next(w, r) })
}

// adminOrUser lets a request through with a valid admin or user token and
// tells next which it was.
func (h *handler) adminOrUser(next principalHandler) http.Handler {
	return h.authorized(true, next)
}

func (h *handler) authorized(users bool, next principalHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.cfg.Tokens == nil {
			writeError(w, http.StatusServiceUnavailable, "the token store is not available on this relay")
			return
		}
		p, err := h.authenticate(r, func() (auth.Principal, error) { return h.cfg.Tokens.Authenticate(bearerToken(r)) })
		var refused *limit.RefusedError
		if errors.As(err, &refused) {
			w.Header().Set("Retry-After", strconv.Itoa(int(refused.RetryAfterDelay()/time.Second)))
			writeError(w, http.StatusTooManyRequests, err.Error())
			return
		}
		if err == nil && p.Kind != auth.KindAdmin && !(users && p.Kind == auth.KindUser) {
			err = auth.ErrWrongKind
		}
		switch {
		case err == nil:
			if h.cfg.Bind != nil {
				h.cfg.Bind(r.Context(), p.TokenID)
			}
			next(w, r, p)
		case errors.Is(err, auth.ErrWrongKind) && users:
			writeError(w, http.StatusForbidden, "this endpoint needs an admin or user token, not an agent token")
		case errors.Is(err, auth.ErrWrongKind):
			writeError(w, http.StatusForbidden, "the operator API needs an admin token, not an agent or user token: "+adminTokenHint)
		case errors.Is(err, auth.ErrNoToken):
			w.Header().Set("WWW-Authenticate", `Bearer realm="switchboard"`)
			writeError(w, http.StatusUnauthorized, "missing admin token: send 'Authorization: Bearer <token>'; "+adminTokenHint)
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="switchboard", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, "invalid admin token (unknown, revoked or malformed): "+adminTokenHint)
		}
	})
}

// authenticate checks a credential presented on the admin listener with
// check, then consults the back-off (Config.AuthFailures). A valid
// credential is let in even from an address being refused, so that
// whoever shares the operator's address (a NAT, a proxy) cannot lock the
// operator out by failing on purpose; an invalid one from such an address
// yields a *limit.RefusedError, and every invalid one counts as a failure.
// A missing credential, or a valid one of the wrong kind, is no failure.
//
// Checking before refusing costs one SHA-256 per attempt, as an attempt
// outside the refusal window does; what stops guessing is the 256-bit
// secret, and a refused guesser learns nothing it would not from a 401.
func (h *handler) authenticate(r *http.Request, check func() (auth.Principal, error)) (auth.Principal, error) {
	p, err := check()
	lim := h.cfg.AuthFailures
	if lim == nil || errors.Is(err, auth.ErrNoToken) {
		return p, err
	}
	ip := limit.ClientIP(r, nil)
	switch {
	case err == nil:
		lim.Succeed(ip)
		return p, nil
	case !errors.Is(err, auth.ErrInvalidToken):
		return p, err
	}
	refused := lim.Check(ip) // before Fail: the failure that opens a window is still answered 401
	lim.Fail(ip)
	if refused != nil {
		return p, refused
	}
	return p, err
}

// bearerToken returns the token of an "Authorization: Bearer <token>" header,
// or "" when there is none.
func bearerToken(r *http.Request) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

func (h *handler) createToken(w http.ResponseWriter, r *http.Request) {
	var req TokenRequest
	if err := decodeJSON(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.Kind != auth.KindAgent && req.Kind != auth.KindUser {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"kind" is %q; it must be "agent" or "user"`, req.Kind))
		return
	}
	secret, tok, err := h.cfg.Tokens.Create(r.Context(), auth.CreateRequest{Kind: req.Kind, Name: req.Name, Devices: req.Devices})
	if errors.Is(err, auth.ErrInvalidRequest) {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if errors.Is(err, auth.ErrUnavailable) {
		writeError(w, http.StatusServiceUnavailable, "no token was created: NATS, where tokens are kept, is unreachable from this relay or has lost its quorum; try again once it is back ("+err.Error()+")")
		return
	}
	if err != nil {
		h.log.Error("creating a token", attrError, err)
		writeError(w, http.StatusInternalServerError, "creating the token failed: "+err.Error())
		return
	}
	w.Header().Set("Location", PathTokens+"/"+tok.ID)
	writeJSON(w, http.StatusCreated, CreatedToken{
		ID: tok.ID, Token: secret, Kind: tok.Kind, Name: tok.Name,
		Devices: nonNil(tok.Devices), CreatedAt: tok.CreatedAt,
	})
}

func (h *handler) listTokens(w http.ResponseWriter, r *http.Request) {
	toks, err := h.cfg.Tokens.List(r.Context())
	if err != nil {
		h.log.Error("listing tokens", attrError, err)
		writeError(w, http.StatusInternalServerError, "listing tokens failed: "+err.Error())
		return
	}
	out := make([]Token, len(toks))
	for i, t := range toks {
		out[i] = tokenFromAuth(t)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) revokeToken(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	err := h.cfg.Tokens.Revoke(r.Context(), id)
	if errors.Is(err, auth.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no token has id %q; list them with GET %s", id, PathTokens))
		return
	}
	if err != nil {
		h.log.Error("revoking a token", attrTokenID, id, attrError, err)
		writeError(w, http.StatusInternalServerError, "revoking the token failed: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeJSON reads one JSON object of at most MaxBodyBytes into v, rejecting
// unknown fields and trailing data.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && !errors.Is(dec.Decode(new(json.RawMessage)), io.EOF) {
		err = errors.New("data after the JSON object")
	}
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooLarge):
		return httperr.New(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes))
	case errors.Is(err, io.EOF):
		return httperr.New(http.StatusBadRequest, `empty request body: send a JSON object such as {"kind":"agent","devices":["robot-1"]}`)
	default:
		return httperr.New(http.StatusBadRequest, "malformed JSON request body: "+err.Error())
	}
}

// writeErr answers err in the operator API's JSON: the status and message
// of the httperr.StatusError in its chain, or 500 and err's own.
func writeErr(w http.ResponseWriter, err error) {
	writeError(w, httperr.StatusOf(err, http.StatusInternalServerError), httperr.MessageOf(err))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the status is sent; a failed write has no one to tell
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+"\n")
}
