package tunnel

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/httperr"
	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// WebSocketPath is the tunnel endpoint for paths that pass only websockets.
const WebSocketPath = Path + "/ws"

// Authorizer decides whether the agent making r may serve device, returning
// the id of its credential or an error with an HTTPStatus() int method.
type Authorizer func(r *http.Request, device string) (agentID string, err error)

// Handler is the relay's tunnel endpoint: it authorizes the agent, takes
// over the connection and adds the session to the pool.
type Handler struct {
	Pool      *Pool
	Authorize Authorizer
	// Place decides whether this relay should hold the device's agent, or
	// send it to the relay that should; nil takes every agent here.
	Place func(r *http.Request, device string) Placement
	// Ready reports whether the relay takes new tunnels; nil means always.
	// A draining relay answers 503 so that the agent dials another.
	Ready func() bool
	// Standby decides whether this relay keeps a standby tunnel for
	// device (ProtocolStandby) beside its tunnel on another relay: nil
	// takes none, as a relay from before hot standby; an error (with an
	// HTTPStatus() int method) refuses it.
	Standby func(r *http.Request, device string) error
	// V1Only makes the endpoint behave as a relay from before version 2:
	// it takes only "Upgrade: switchboard-tunnel/1" and ignores the
	// WebSocket offer of version 2. For tests of mixed fleets.
	V1Only bool
	// SelfID returns this relay's id, named in a standby's answer;
	// optional.
	SelfID func() string
	Logger *slog.Logger
}

// ServeHTTP implements http.Handler for Path and WebSocketPath.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.Ready != nil && !h.Ready() {
		w.Header().Set("Retry-After", "1")
		textError(w, http.StatusServiceUnavailable, "this relay is draining; connect to another")
		return
	}
	device := r.URL.Query().Get("device")
	if device == "" {
		textError(w, http.StatusBadRequest, "missing the device query parameter: "+Path+"?device=<name>")
		return
	}
	if err := auth.ValidateDeviceName(device); err != nil {
		textError(w, http.StatusBadRequest, err.Error())
		return
	}
	agentID, err := h.Authorize(r, device)
	if err != nil {
		textError(w, httperr.StatusOf(err, http.StatusForbidden), err.Error())
		return
	}
	instance := r.Header.Get(wire.InstanceHeader)
	if OffersStandby(r) && h.Standby != nil && r.URL.Path != WebSocketPath {
		h.acceptStandby(w, r, device, agentID, instance)
		return
	}
	var place Placement
	if h.Place != nil {
		place = h.Place(r, device)
	}
	if place.RelayID != "" {
		w.Header().Set(RelayIDHeader, place.RelayID)
	}
	if list := FormatRelays(place.Relays); list != "" {
		w.Header().Set(RelaysHeader, list)
	}
	if place.Refuse != "" {
		w.Header().Set("Retry-After", "1")
		textError(w, http.StatusServiceUnavailable, place.Refuse)
		return
	}
	if place.Redirect != "" {
		w.Header().Set("Location", place.Redirect)
		w.Header().Set(HolderHeader, place.Holder)
		textError(w, http.StatusTemporaryRedirect, "relay "+place.Holder+" holds this device: connect there")
		return
	}
	switch {
	case r.URL.Path == WebSocketPath:
		h.acceptWebSocket(w, r, device, agentID, instance)
	case IsHandshake(r) && !(h.V1Only && !strings.EqualFold(r.Header.Get("Upgrade"), Protocol)):
		version := Offered(r)
		if h.V1Only {
			version = V1
		}
		services, err := h.services(r, version)
		if err != nil {
			textError(w, http.StatusBadRequest, err.Error())
			return
		}
		conn, err := acceptVersion(w, place, version)
		if err != nil {
			h.log().Warn("tunnel handshake failed", logkey.Device, device, logkey.Err, err)
			return
		}
		h.add(conn, device, agentID, instance, version, services, AgentPing(r))
	default:
		textError(w, http.StatusBadRequest, fmt.Sprintf("a tunnel opens with 'Connection: Upgrade' and 'Upgrade: %s', or as a websocket on %s", Protocol, WebSocketPath))
	}
}

func (h *Handler) acceptWebSocket(w http.ResponseWriter, r *http.Request, device, agentID, instance string) {
	version := V1
	if !h.V1Only && strings.EqualFold(r.Header.Get(VersionHeader), ProtocolV2) {
		version = V2
	}
	services, err := h.services(r, version)
	if err != nil {
		textError(w, http.StatusBadRequest, err.Error())
		return
	}
	if version == V2 {
		w.Header().Set(VersionHeader, ProtocolV2)
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return // Accept has answered
	}
	conn := websocket.NetConn(context.Background(), c, websocket.MessageBinary)
	h.add(conn, device, agentID, instance, version, services, AgentPing(r))
}

// acceptStandby takes a standby tunnel: no placement, no redirect; the
// session waits apart from the tunnels until the relay promotes it.
func (h *Handler) acceptStandby(w http.ResponseWriter, r *http.Request, device, agentID, instance string) {
	if err := h.Standby(r, device); err != nil {
		if httperr.StatusOf(err, http.StatusConflict) == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		textError(w, httperr.StatusOf(err, http.StatusConflict), err.Error())
		return
	}
	services, err := h.services(r, V2)
	if err != nil {
		textError(w, http.StatusBadRequest, err.Error())
		return
	}
	conn, err := acceptVersion(w, Placement{RelayID: h.selfID()}, standbyVersion)
	if err != nil {
		h.log().Warn("standby handshake failed", logkey.Device, device, logkey.Err, err)
		return
	}
	if _, err := h.Pool.AddStandby(conn, device, agentID, instance, services, AgentPing(r)); err != nil {
		h.log().Info("standby dropped", logkey.Device, device, logkey.Instance, instance, logkey.Err, err)
	}
}

// selfID is this relay's id as placement knows it, for a standby's answer.
func (h *Handler) selfID() string {
	if h.SelfID != nil {
		return h.SelfID()
	}
	return ""
}

// services reads the services a version 2 agent announced.
func (h *Handler) services(r *http.Request, version int) (map[string]service.Announced, error) {
	if version != V2 {
		return nil, nil
	}
	v := r.Header.Get(ServicesHeader)
	if v == "" {
		return nil, fmt.Errorf("a %s tunnel needs the agent's services in %s", ProtocolV2, ServicesHeader)
	}
	return service.ParseAnnouncement(v)
}

func (h *Handler) add(conn net.Conn, device, agentID, instance string, version int, services map[string]service.Announced, agentPing time.Duration) {
	var err error
	switch {
	case version == V2 && agentPing > 0:
		_, err = h.Pool.AddV2Paced(conn, device, agentID, instance, services, agentPing)
	case version == V2:
		_, err = h.Pool.AddV2(conn, device, agentID, instance, services)
	default:
		_, err = h.Pool.Add(conn, device, agentID, instance)
	}
	if err != nil {
		h.log().Info("tunnel dropped", logkey.Device, device, logkey.Instance, instance, logkey.Err, err)
	}
}

func (h *Handler) log() *slog.Logger {
	if h.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Logger
}

func textError(w http.ResponseWriter, status int, msg string) { httperr.Text(w, status, msg) }
