package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/httperr"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// Paths of the fleet part of the operator API.
const (
	PathRelays  = "/api/v1/relays"  // GET; /{id}; GET, POST /{id}/drain (DrainRequest); POST /{id}/undrain
	PathDevices = "/api/v1/devices" // GET; /{name}; POST /{name}/cancel
	PathEvents  = "/api/v1/events"  // GET ?limit=N; ?follow=1 streams NDJSON
	PathStatus  = "/api/v1/status"  // GET
	PathRoll    = "/api/v1/roll"    // GET; PUT /enabled; PUT, DELETE /state
)

// DefaultEventsLimit is how many events GET /api/v1/events returns by
// default, and MaxEventsList the most it returns.
const (
	DefaultEventsLimit = 100
	MaxEventsList      = fleet.MaxEventsList
)

// Fleet is the fleet state the operator API reads and changes; a
// *fleet.Member implements it. Its views are fleet's own: the handlers
// answer with this package's types (contract.go), filled from them.
type Fleet interface {
	Relays() []fleet.RelayStatus
	Relay(id string) (fleet.RelayStatus, error)
	SetRelayDraining(ctx context.Context, id string, draining bool) error
	Record(e fleet.Event)
	Devices() []fleet.DeviceStatus
	Device(name string) (fleet.DeviceLink, error)
	Events(ctx context.Context, n int) ([]fleet.Event, error)
	FollowEvents(ctx context.Context, fn func(fleet.Event) error) error
	Status() fleet.Status
	CancelDevice(ctx context.Context, device, reason string) error
	RollEnabled(ctx context.Context) (bool, error)
	SetRollEnabled(ctx context.Context, on bool) error
	Roll(ctx context.Context) (*fleet.RollState, error)
	SaveRoll(ctx context.Context, s fleet.RollState) error
	ClearRoll(ctx context.Context) error
}

// RollInfo answers GET /api/v1/roll.
type RollInfo struct {
	// Enabled says whether the fleet's owner allows rolling updates.
	Enabled bool `json:"enabled"`
	// State is the roll in progress; null when there is none.
	State *RollState `json:"state"`
}

// RollSwitch is the body of PUT /api/v1/roll/enabled.
type RollSwitch struct {
	Enabled bool `json:"enabled"`
}

// CancelAnswer answers POST /api/v1/devices/{name}/cancel.
type CancelAnswer struct {
	Device    string `json:"device"`
	Cancelled bool   `json:"cancelled"`
}

// UserDevice is a device as a user token sees it: its name, state and
// freshness, never the relay behind it.
type UserDevice struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Fresh bool   `json:"fresh"`
}

func (h *handler) routeFleet(mux *http.ServeMux) {
	mux.Handle("GET "+PathRelays, h.admin(h.fleetOnly(h.listRelays)))
	mux.Handle("GET "+PathRelays+"/{id}", h.admin(h.fleetOnly(h.showRelay)))
	mux.Handle("GET "+PathRelays+"/{id}/drain", h.admin(h.fleetOnly(h.drainRelay(true, true))))
	mux.Handle("POST "+PathRelays+"/{id}/drain", h.admin(h.fleetOnly(h.drainRelay(true, false))))
	mux.Handle("POST "+PathRelays+"/{id}/undrain", h.admin(h.fleetOnly(h.drainRelay(false, false))))
	mux.Handle("GET "+PathDevices, h.adminOrUser(h.fleetOnlyP(h.listDevices)))
	mux.Handle("GET "+PathDevices+"/{name}", h.adminOrUser(h.fleetOnlyP(h.showDevice)))
	mux.Handle("POST "+PathDevices+"/{name}/cancel", h.admin(h.fleetOnly(h.cancelDevice)))
	mux.Handle("GET "+PathEvents, h.admin(h.fleetOnly(h.listEvents)))
	mux.Handle("GET "+PathStatus, h.admin(h.fleetOnly(h.status)))
	mux.Handle("GET "+PathRoll, h.admin(h.fleetOnly(h.getRoll)))
	mux.Handle("PUT "+PathRoll+"/enabled", h.admin(h.fleetOnly(h.setRollEnabled)))
	mux.Handle("PUT "+PathRoll+"/state", h.admin(h.fleetOnly(h.saveRoll)))
	mux.Handle("DELETE "+PathRoll+"/state", h.admin(h.fleetOnly(h.clearRoll)))
	h.routeSecret(mux)
}

// fleetOnly answers 503 when the relay has no fleet state.
func (h *handler) fleetOnly(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.cfg.Fleet == nil {
			writeError(w, http.StatusServiceUnavailable, "the fleet state is not available on this relay")
			return
		}
		next(w, r)
	}
}

func (h *handler) fleetOnlyP(next principalHandler) principalHandler {
	return func(w http.ResponseWriter, r *http.Request, p auth.Principal) {
		h.fleetOnly(func(w http.ResponseWriter, r *http.Request) { next(w, r, p) })(w, r)
	}
}

func (h *handler) listRelays(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, relaysFrom(h.cfg.Fleet.Relays()))
}

func (h *handler) showRelay(w http.ResponseWriter, r *http.Request) {
	rs, err := h.cfg.Fleet.Relay(r.PathValue("id"))
	if err != nil {
		writeFleetError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, relayFrom(rs))
}

func (h *handler) listDevices(w http.ResponseWriter, _ *http.Request, p auth.Principal) {
	all := h.cfg.Fleet.Devices()
	if p.Kind == auth.KindAdmin {
		writeJSON(w, http.StatusOK, devicesFrom(all))
		return
	}
	out := []UserDevice{}
	for _, d := range all {
		if p.AllowsAny(d.Name) {
			out = append(out, UserDevice{Name: d.Name, State: d.State, Fresh: d.Fresh})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) showDevice(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	name := r.PathValue("name")
	link, err := h.cfg.Fleet.Device(name)
	if p.Kind != auth.KindAdmin && !p.AllowsAny(name) {
		// The same answer as an unknown device: a user learns nothing of
		// devices it may not use.
		err = fmt.Errorf("device %q: %w", name, fleet.ErrNotFound)
	}
	if err != nil {
		writeFleetError(w, err)
		return
	}
	if p.Kind == auth.KindAdmin {
		writeJSON(w, http.StatusOK, deviceLinkFrom(link))
		return
	}
	writeJSON(w, http.StatusOK, UserDevice{Name: link.Name, State: link.State, Fresh: link.Fresh})
}

func (h *handler) cancelDevice(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := auth.ValidateDeviceName(name); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := h.cfg.Fleet.CancelDevice(r.Context(), name, "cancelled by an operator"); err != nil {
		writeFleetError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, CancelAnswer{Device: name, Cancelled: true})
}

func (h *handler) listEvents(w http.ResponseWriter, r *http.Request) {
	limit := DefaultEventsLimit
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > fleet.MaxEventsList {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: give a number from 1 to %d", s, fleet.MaxEventsList))
			return
		}
		limit = n
	}
	follow := r.URL.Query().Get("follow")
	if follow != "" && follow != "0" && follow != "1" && follow != "true" && follow != "false" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("follow %q: use 1 or 0", follow))
		return
	}
	if follow == "1" || follow == "true" {
		h.followEvents(w, r)
		return
	}
	evs, err := h.cfg.Fleet.Events(r.Context(), limit)
	if err != nil {
		h.log.Warn("reading events", attrError, err)
		writeError(w, http.StatusServiceUnavailable, "the event log cannot be read now (is NATS reachable?): "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, eventsFrom(evs))
}

// followEvents streams events as they are recorded, one JSON object per
// line, until the client goes away.
func (h *handler) followEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	err := h.cfg.Fleet.FollowEvents(r.Context(), func(e fleet.Event) error {
		if err := enc.Encode(eventFrom(e)); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil && r.Context().Err() == nil {
		h.log.Debug("following events ended", attrError, err)
	}
}

func (h *handler) getRoll(w http.ResponseWriter, r *http.Request) {
	on, err := h.cfg.Fleet.RollEnabled(r.Context())
	if err != nil {
		writeFleetError(w, err)
		return
	}
	st, err := h.cfg.Fleet.Roll(r.Context())
	if err != nil {
		writeFleetError(w, err)
		return
	}
	info := RollInfo{Enabled: on}
	if st != nil {
		s := rollStateFrom(*st)
		info.State = &s
	}
	writeJSON(w, http.StatusOK, info)
}

func (h *handler) setRollEnabled(w http.ResponseWriter, r *http.Request) {
	var req RollSwitch
	if err := decodeJSON(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if err := h.cfg.Fleet.SetRollEnabled(r.Context(), req.Enabled); err != nil {
		writeFleetError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, req)
}

func (h *handler) saveRoll(w http.ResponseWriter, r *http.Request) {
	var s RollState
	if err := decodeJSON(w, r, &s); err != nil {
		writeErr(w, err)
		return
	}
	if len(s.Order) == 0 || len(s.Order) > 1000 {
		writeError(w, http.StatusBadRequest, `a roll names 1 to 1000 relays in "order"`)
		return
	}
	if err := h.cfg.Fleet.SaveRoll(r.Context(), s.toFleet()); err != nil {
		writeFleetError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) clearRoll(w http.ResponseWriter, r *http.Request) {
	if err := h.cfg.Fleet.ClearRoll(r.Context()); err != nil {
		writeFleetError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) status(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, statusFrom(h.cfg.Fleet.Status(), h.cfg.Secret))
}

func writeFleetError(w http.ResponseWriter, err error) { writeErr(w, fleetError(err)) }

// fleetError gives a failure of the fleet state its status.
func fleetError(err error) error {
	switch {
	case errors.Is(err, fleet.ErrNotFound):
		return &httperr.Error{Status: http.StatusNotFound, Err: err,
			Message: err.Error() + "; list them with 'switchboard ctl relays list' or 'ctl devices list'"}
	case store.Unavailable(err), errors.Is(err, fleet.ErrConflict):
		return &httperr.Error{Status: http.StatusServiceUnavailable, Err: err,
			Message: "the fleet state in NATS did not answer (NATS unreachable, or a cluster electing a leader or without its quorum); a change asked for may not have been made: check with 'switchboard ctl relays list' or 'ctl devices list', and try again: " + err.Error()}
	}
	return &httperr.Error{Status: http.StatusInternalServerError, Err: err, Message: err.Error()}
}
