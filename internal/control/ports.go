package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/ports"
)

// PathPorts holds the fleet's public port mappings: POST maps a port, GET
// lists them, DELETE PathPorts/{network}/{port} unmaps one.
const PathPorts = "/api/v1/ports"

// PortStore is the fleet's port mappings, as the API manages them.
type PortStore interface {
	// Add maps a port, or fails with ports.ErrMapped or ports.ErrInvalid.
	Add(ctx context.Context, m ports.Mapping) error
	// Remove unmaps a port, or fails with ports.ErrNotMapped.
	Remove(ctx context.Context, network string, port int) (ports.Mapping, error)
	// List returns the mappings, by network and port.
	List() []ports.Mapping
}

var _ PortStore = (*ports.Store)(nil)

// routePorts adds the port mappings' endpoints.
func (h *handler) routePorts(mux *http.ServeMux) {
	mux.Handle("POST "+PathPorts, h.authorized(false, h.addPort))
	mux.Handle("GET "+PathPorts, h.admin(h.listPorts))
	mux.Handle("DELETE "+PathPorts+"/{network}/{port}", h.admin(h.removePort))
}

func (h *handler) portStore(w http.ResponseWriter) bool {
	if h.cfg.Ports == nil {
		writeError(w, http.StatusServiceUnavailable, "port mappings are not available on this relay")
		return false
	}
	return true
}

func (h *handler) addPort(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !h.portStore(w) {
		return
	}
	var req PortRequest
	if err := decodeJSON(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.Network == "" {
		req.Network = ports.TCP
	}
	if req.Network == ports.TCP && h.cfg.OwnPorts != nil && slices.Contains(h.cfg.OwnPorts(), req.Port) {
		writeError(w, http.StatusConflict, fmt.Sprintf("tcp port %d is this relay's own listener (public and admin listeners: %v): map another port", req.Port, h.cfg.OwnPorts()))
		return
	}
	m := ports.Mapping{Port: req.Port, Network: req.Network, Target: req.Target, Allow: req.Allow,
		MaxConns: req.MaxConnections, ProxyProtocol: req.ProxyProtocol, CreatedAt: time.Now().UTC(), CreatedBy: p.Name}
	err := h.cfg.Ports.Add(r.Context(), m)
	switch {
	case errors.Is(err, ports.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ports.ErrMapped):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil:
		h.log.Error("mapping a port", attrError, err)
		writeError(w, http.StatusServiceUnavailable, "the port was not mapped: NATS, where the mappings are kept, did not answer; try again once it is back ("+err.Error()+")")
	default:
		w.Header().Set("Location", PathPorts+"/"+m.Network+"/"+strconv.Itoa(m.Port))
		writeJSON(w, http.StatusCreated, portMappingFrom(m))
	}
}

func (h *handler) listPorts(w http.ResponseWriter, _ *http.Request) {
	if !h.portStore(w) {
		return
	}
	ms := h.cfg.Ports.List()
	out := make([]PortMapping, 0, len(ms))
	for _, m := range ms {
		out = append(out, portMappingFrom(m))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) removePort(w http.ResponseWriter, r *http.Request) {
	if !h.portStore(w) {
		return
	}
	network := r.PathValue("network")
	if network != ports.TCP && network != ports.UDP {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("network %q: use tcp or udp", network))
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("port %q: use 1 to 65535", r.PathValue("port")))
		return
	}
	m, err := h.cfg.Ports.Remove(r.Context(), network, port)
	switch {
	case errors.Is(err, ports.ErrNotMapped):
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s; list them with GET %s", err, PathPorts))
	case err != nil:
		h.log.Error("unmapping a port", attrError, err)
		writeError(w, http.StatusServiceUnavailable, "the port was not unmapped: NATS, where the mappings are kept, did not answer; try again once it is back ("+err.Error()+")")
	default:
		writeJSON(w, http.StatusOK, portMappingFrom(m))
	}
}

// AddPort maps a port of every relay to a device's service. A port mapped
// already yields an *APIError with Status 409, a bad mapping 400.
func (c *Client) AddPort(ctx context.Context, req PortRequest) (PortMapping, error) {
	var out PortMapping
	err := c.do(ctx, http.MethodPost, PathPorts, req, http.StatusCreated, &out)
	return out, err
}

// ListPorts returns the fleet's port mappings.
func (c *Client) ListPorts(ctx context.Context) ([]PortMapping, error) {
	var out []PortMapping
	err := c.do(ctx, http.MethodGet, PathPorts, nil, http.StatusOK, &out)
	return out, err
}

// RemovePort unmaps a port and returns the mapping it had. A port not
// mapped yields an *APIError with Status 404.
func (c *Client) RemovePort(ctx context.Context, network string, port int) (PortMapping, error) {
	var out PortMapping
	err := c.do(ctx, http.MethodDelete, PathPorts+"/"+network+"/"+strconv.Itoa(port), nil, http.StatusOK, &out)
	return out, err
}
