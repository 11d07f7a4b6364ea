package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/httperr"
	"github.com/switchboard-relay/switchboard/internal/ranking"
)

// DrainRequest is the optional body of POST /api/v1/relays/{id}/drain; an
// empty body asks for a guarded drain.
type DrainRequest struct {
	// Force drains the relay even when the guards refuse: it is the last
	// relay serving, or the others have no room for its devices.
	Force bool `json:"force,omitempty"`
}

// DrainAnswer answers POST /api/v1/relays/{id}/drain and /undrain, and
// GET /api/v1/relays/{id}/drain, which only asks the guards.
type DrainAnswer struct {
	ID       string `json:"id"`
	Draining bool   `json:"draining"`
	// Check says that nothing was changed: the answer to a GET, the drain
	// would be done.
	Check bool `json:"check,omitempty"`
	// Warning says, for a drain that a guard would have refused (forced, or
	// of a relay already draining), what happens to devices meanwhile.
	Warning string `json:"warning,omitempty"`
}

// errDrainRefused is wrapped by a drain that the guards refuse.
var errDrainRefused = errors.New("drain refused")

// drainRefusal is a drain the guards refuse, with why and what to do:
// 409 Conflict.
type drainRefusal struct {
	id, reason string
	hint       bool // add how to force it
}

func (e *drainRefusal) Error() string {
	if !e.hint {
		return e.reason
	}
	return fmt.Sprintf(`%s; or, to drain it anyway, pass --force ('switchboard ctl relays drain --force %s', or {"force": true} in the API request)`, e.reason, e.id)
}

func (e *drainRefusal) Unwrap() error { return errDrainRefused }

// DrainGuard decides on draining relay id, given the fleet's relays. It
// returns a non-empty refusal when the drain would leave devices nowhere to
// go, and the consequence: what happens to devices if the drain is done
// anyway. A relay that is not serving (stale, unhealthy, stopping) or
// already draining moves nothing by being drained: it is never refused,
// but the consequence still says where its devices stand.
func DrainGuard(relays []fleet.RelayStatus, id string) (refusal, consequence string, err error) {
	var target *fleet.RelayStatus
	siblings, room, unlimited := 0, 0, false
	for i := range relays {
		rs := &relays[i]
		if rs.ID == id {
			target = rs
			continue
		}
		if serving(rs) {
			siblings++
			if rs.MaxForward <= 0 {
				unlimited = true
			}
			room += max(0, rs.MaxForward-rs.AttachedDevices)
		}
	}
	if target == nil {
		return "", "", fmt.Errorf("relay %q: %w", id, fleet.ErrNotFound)
	}
	n := target.AttachedDevices
	switch {
	case siblings == 0 && n == 0:
		refusal = fmt.Sprintf("relay %s is the last relay serving: new devices would still attach to it, drained or not, as there is nowhere else for them; add a relay first", id)
		consequence = fmt.Sprintf("relay %s is draining, but no other relay is serving: it still takes new devices, as there is nowhere else for them, until another relay serves", id)
	case siblings == 0:
		refusal = fmt.Sprintf("relay %s is the last relay serving: draining it leaves its %s nowhere to go, and new devices would still attach to it; add a relay first", id, devices(n))
		consequence = fmt.Sprintf("relay %s is draining, but no other relay is serving: it keeps its %s and still takes new devices, as there is nowhere else for them, until another relay serves", id, devices(n))
	case !unlimited && room < n:
		refusal = fmt.Sprintf("relay %s holds %s but the other relays have room for %d; add a relay or raise their --max-forward first", id, devices(n), room)
		consequence = fmt.Sprintf("relay %s is draining, but the other relays have room for %d of its %s: the rest stay on it until room appears", id, room, devices(n))
	}
	if !serving(target) || target.Draining {
		refusal = ""
	}
	return refusal, consequence, nil
}

// serving reports whether rs takes devices now (ranking.State.Available).
func serving(rs *fleet.RelayStatus) bool {
	return ranking.State{Fresh: rs.Fresh, Healthy: rs.Healthy, Draining: rs.Draining, Stopping: rs.Stopping}.Available()
}

func devices(n int) string {
	if n == 1 {
		return "1 device"
	}
	return fmt.Sprintf("%d devices", n)
}

// setDraining drains (guarded as req says) or undrains relay id: the one
// path of the API, the admin page and, through the API, ctl and its
// rolling update. A refused drain yields a *drainRefusal; check only asks
// the guards.
func (h *handler) setDraining(ctx context.Context, id string, draining bool, req DrainRequest, check, byAPI bool) (DrainAnswer, error) {
	f := h.cfg.Fleet
	answer := DrainAnswer{ID: id, Draining: draining, Check: check}
	if draining {
		refusal, consequence, err := DrainGuard(f.Relays(), id)
		if err != nil {
			return DrainAnswer{}, err
		}
		if refusal != "" && !req.Force {
			return DrainAnswer{}, &drainRefusal{id: id, reason: refusal, hint: byAPI && !check}
		}
		answer.Warning = consequence
		if check {
			return answer, nil
		}
		if err := f.SetRelayDraining(ctx, id, true); err != nil {
			return DrainAnswer{}, err
		}
		if refusal != "" {
			h.log.Warn("relay drained by force", attrRelay, id, attrError, refusal)
			f.Record(fleet.Event{Type: fleet.EventRelayDrainForced, RelayID: id, Message: "drain forced past the guard (" + refusal + "): " + consequence})
		}
		return answer, nil
	}
	return answer, f.SetRelayDraining(ctx, id, false)
}

// drainRelay answers POST /api/v1/relays/{id}/drain and /undrain, and, with
// check, GET /api/v1/relays/{id}/drain: would the drain be done now? A
// rolling update asks this before it holds each relay.
func (h *handler) drainRelay(draining, check bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req DrainRequest
		if !check {
			if err := decodeOptionalJSON(w, r, &req); err != nil {
				writeErr(w, err)
				return
			}
		}
		id := r.PathValue("id")
		answer, err := h.setDraining(r.Context(), id, draining, req, check, true)
		var refused *drainRefusal
		if errors.As(err, &refused) {
			writeError(w, http.StatusConflict, err.Error())
			return
		}
		if err != nil {
			writeFleetError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, answer)
	}
}

// decodeOptionalJSON is decodeJSON for a body that may be left out: an
// empty body leaves v as it is.
func decodeOptionalJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return httperr.New(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes))
	case err != nil:
		return httperr.New(http.StatusBadRequest, "reading the request body: "+err.Error())
	case len(bytes.TrimSpace(body)) == 0:
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil && !errors.Is(dec.Decode(new(json.RawMessage)), io.EOF) {
		err = errors.New("data after the JSON object")
	}
	if err != nil {
		return httperr.New(http.StatusBadRequest, "malformed JSON request body: "+err.Error())
	}
	return nil
}
