// Package longpoll serves the agent side of the http-relay long-poll protocol
// on a relay: GET /server/request, POST /server/response and
// POST /server/requeststream. It translates HTTP to calls on the broker and
// the broker's errors back to the status codes that the protocol's agents
// expect. It knows nothing about listeners or users.
package longpoll

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/httperr"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// AgentAuthorizer decides whether the agent making r may serve device. It
// returns the id of the agent's credential ("" for anonymous agents) or an
// error carrying an HTTP status (401 or 403) via an HTTPStatus() int method.
type AgentAuthorizer func(r *http.Request, device string) (agentID string, err error)

// Config configures the handler.
type Config struct {
	// Broker matches requests with polls. Required.
	Broker *broker.Broker
	// Authorize checks agents. Required; use AllowAll for anonymous agents.
	Authorize AgentAuthorizer
	// MaxChunkBytes caps one posted HttpResponse message. Default 16 MiB
	// (the reference agent posts at most 1 MiB of body per chunk).
	MaxChunkBytes int
	// Route, if set, says where an agent's call for device belongs — a poll
	// (requestID "") or an answer for the request requestID: nil serves it
	// here, else the returned handler takes it (forwarding it to the relay
	// that holds the device or the request). It runs after the agent's
	// credential was checked.
	Route func(r *http.Request, device, requestID string) http.Handler
	// Logger receives the handler's logs; nil discards them.
	Logger *slog.Logger
}

// AllowAll is an AgentAuthorizer that lets every agent serve every device.
func AllowAll(*http.Request, string) (string, error) { return "", nil }

// Handler serves the long-poll protocol's agent endpoints.
type Handler struct {
	cfg Config
	mux *http.ServeMux
}

// NewHandler returns the handler for the paths under /server/.
func NewHandler(cfg Config) *Handler {
	if cfg.MaxChunkBytes <= 0 {
		cfg.MaxChunkBytes = 16 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	h.mux.HandleFunc("/server/request", only(http.MethodGet, h.request))
	h.mux.HandleFunc("/server/response", only(http.MethodPost, h.response))
	h.mux.HandleFunc("/server/requeststream", only(http.MethodPost, h.requestStream))
	h.mux.HandleFunc("/server/", func(w http.ResponseWriter, r *http.Request) {
		textError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not an agent endpoint of this relay (GET /server/request, POST /server/response, POST /server/requeststream)", r.Method, r.URL.Path))
	})
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// only answers 405 to methods other than method.
func only(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			textError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s takes %s, not %s", r.URL.Path, method, r.Method))
			return
		}
		h(w, r)
	}
}

// request is the long poll: it answers with one user request for the device.
func (h *Handler) request(w http.ResponseWriter, r *http.Request) {
	device := r.URL.Query().Get("server")
	if device == "" {
		textError(w, http.StatusBadRequest, "missing the server query parameter naming the device: /server/request?server=<device>")
		return
	}
	agentID, err := h.cfg.Authorize(r, device)
	if err != nil {
		writeError(w, err)
		return
	}
	if h.routed(w, r, device, "") {
		return
	}
	ctx := r.Context()
	if r.Header.Get(wire.PollEndHeader) != "" {
		// A forwarded poll that its relay may end by ending the body.
		var end context.CancelCauseFunc
		ctx, end = context.WithCancelCause(ctx)
		defer end(nil)
		go func() {
			io.Copy(io.Discard, io.LimitReader(r.Body, 1<<10))
			end(broker.ErrPollEnded)
		}()
	}
	ex, err := h.cfg.Broker.Poll(ctx, device, agentID, r.Header.Get(wire.InstanceHeader))
	switch {
	case errors.Is(err, broker.ErrPollEnded):
		textError(w, http.StatusRequestTimeout, "the relay this poll came through ended it; poll again")
		return
	case errors.Is(err, broker.ErrPollTimeout):
		textError(w, http.StatusRequestTimeout, "no request for this device within the poll wait; poll again")
		return
	case errors.Is(err, broker.ErrDraining):
		textError(w, http.StatusRequestTimeout, "this relay is shutting down; poll again")
		return
	case err != nil:
		return // the agent went away
	}
	w.Header().Set("Content-Type", wire.ContentTypeRequest)
	w.Header().Set("Content-Length", strconv.Itoa(ex.MessageSize()))
	if err := ex.WriteMessage(w); err != nil {
		h.cfg.Broker.Requeue(ex)
		return
	}
	if err := http.NewResponseController(w).Flush(); err != nil {
		h.cfg.Broker.Requeue(ex)
	}
}

// response takes one chunk of an agent's response.
func (h *Handler) response(w http.ResponseWriter, r *http.Request) {
	body, err := readLimited(r.Body, h.cfg.MaxChunkBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	msg, err := wire.UnmarshalResponse(body, h.cfg.MaxChunkBytes)
	if err != nil {
		textError(w, http.StatusBadRequest, "cannot decode the HttpResponse: "+err.Error())
		return
	}
	device, ok := wire.RequestDevice(msg.ID)
	if !ok {
		textError(w, http.StatusBadRequest, "the HttpResponse has no valid id (want <device>:<hex>)")
		return
	}
	agentID, err := h.cfg.Authorize(r, device)
	if err != nil {
		writeError(w, err)
		return
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	// A request in flight here is answered here, wherever its device went.
	if !h.cfg.Broker.Knows(msg.ID) && h.routed(w, r, device, msg.ID) {
		return
	}
	if err := h.cfg.Broker.Deliver(r.Context(), agentID, msg); err != nil {
		writeAgentError(w, err, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok")
}

// requestStream hands the user's bytes after a 101 upgrade to the agent.
func (h *Handler) requestStream(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		textError(w, http.StatusBadRequest, "missing the id query parameter: /server/requeststream?id=<request id>")
		return
	}
	device, ok := wire.RequestDevice(id)
	if !ok {
		textError(w, http.StatusBadRequest, "malformed request id (want <device>:<hex>)")
		return
	}
	agentID, err := h.cfg.Authorize(r, device)
	if err != nil {
		writeError(w, err)
		return
	}
	if !h.cfg.Broker.Knows(id) && h.routed(w, r, device, id) {
		return
	}
	p, err := h.cfg.Broker.NextUpstream(r.Context(), agentID, id)
	if err != nil {
		writeAgentError(w, err, http.StatusGone)
		return
	}
	w.Header().Set("Content-Type", "application/octet-data")
	w.Write(p)
}

// routed hands r to the handler Route names, if any, and reports whether
// it did.
func (h *Handler) routed(w http.ResponseWriter, r *http.Request, device, requestID string) bool {
	if h.cfg.Route == nil {
		return false
	}
	next := h.cfg.Route(r, device, requestID)
	if next == nil {
		return false
	}
	next.ServeHTTP(w, r)
	return true
}

// writeAgentError maps broker errors to the protocol's statuses; unknown
// requests get gone (400 for responses, 410 for request streams).
func writeAgentError(w http.ResponseWriter, err error, gone int) {
	switch {
	case errors.Is(err, broker.ErrUnknownRequest):
		textError(w, gone, "unknown or finished request id: the user went away or the request timed out")
	case errors.Is(err, broker.ErrStreamClosed):
		textError(w, http.StatusGone, "the user closed its side of the stream")
	case errors.Is(err, broker.ErrNotYours):
		textError(w, http.StatusForbidden, "this request was handed to another agent credential")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The agent went away; nobody reads the answer.
	default:
		writeError(w, err)
	}
}

func readLimited(r io.Reader, limit int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, &httperr.Error{Status: http.StatusBadRequest, Message: "could not read the posted body: " + err.Error(), Err: err}
	}
	if len(b) > limit {
		return nil, httperr.New(http.StatusRequestEntityTooLarge,
			fmt.Sprintf("the posted message exceeds the relay's %d-byte chunk limit; lower the agent's --max_chunk_size", limit))
	}
	return b, nil
}

// writeError answers with err's status, or 500. Agents are not sent
// Retry-After: they poll again on their own schedule.
func writeError(w http.ResponseWriter, err error) {
	httperr.Text(w, httperr.StatusOf(err, http.StatusInternalServerError), httperr.MessageOf(err))
}

func textError(w http.ResponseWriter, status int, msg string) { httperr.Text(w, status, msg) }
