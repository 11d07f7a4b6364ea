package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/switchboard-relay/switchboard/internal/fleetsecret"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Paths of the fleet secret part of the operator API.
const (
	// PathSecret: GET the fleet secret's status (fingerprints, never secrets).
	PathSecret = "/api/v1/secret"
	// PathRotation: POST begins a rotation (or finds the one in progress);
	// POST /sign and /finish take its next steps.
	PathRotation = PathSecret + "/rotation"
)

// MaxRotationGrace is the longest an old secret may stay accepted after a
// rotation.
const MaxRotationGrace = 30 * 24 * time.Hour

// FleetSecret is the fleet secret the operator API reads and rotates; a
// *fleetsecret.Keeper implements it. Without one (Config.Secret nil) the
// paths under PathSecret answer 503.
type FleetSecret interface {
	Status() fleetsecret.Status
	Parity() fleetsecret.Parity
	Report() (fingerprint string, accepted []string, source string)
	BeginRotation(ctx context.Context, by string) (fleetsecret.RecordInfo, error)
	SignWithNew(ctx context.Context, by string) (fleetsecret.RecordInfo, error)
	FinishRotation(ctx context.Context, by string, grace time.Duration) (fleetsecret.RecordInfo, error)
}

var _ FleetSecret = (*fleetsecret.Keeper)(nil)

// RotationStep is the body of the POSTs under PathRotation.
type RotationStep struct {
	// By says who rotates, for the record and the events.
	By string `json:"by,omitempty"`
	// GraceSeconds, for /finish, keeps the old secret accepted (never
	// signing) this long; 0 drops it at once.
	GraceSeconds int64 `json:"grace_seconds,omitempty"`
}

func (h *handler) routeSecret(mux *http.ServeMux) {
	mux.Handle("GET "+PathSecret, h.admin(h.secretOnly(h.secretStatus)))
	mux.Handle("POST "+PathRotation, h.admin(h.secretOnly(h.rotationStep("begin"))))
	mux.Handle("POST "+PathRotation+"/sign", h.admin(h.secretOnly(h.rotationStep("sign"))))
	mux.Handle("POST "+PathRotation+"/finish", h.admin(h.secretOnly(h.rotationStep("finish"))))
}

// secretOnly answers 503 when the relay has no fleet secret to show.
func (h *handler) secretOnly(next func(http.ResponseWriter, *http.Request, FleetSecret)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sf := h.cfg.Secret
		if sf == nil {
			writeError(w, http.StatusServiceUnavailable, "the fleet secret is not available on this relay")
			return
		}
		next(w, r, sf)
	}
}

func (h *handler) secretStatus(w http.ResponseWriter, _ *http.Request, sf FleetSecret) {
	writeJSON(w, http.StatusOK, secretStatusFrom(sf.Status()))
}

func (h *handler) rotationStep(step string) func(http.ResponseWriter, *http.Request, FleetSecret) {
	return func(w http.ResponseWriter, r *http.Request, sf FleetSecret) {
		var req RotationStep
		if err := decodeJSON(w, r, &req); err != nil {
			writeErr(w, err)
			return
		}
		grace := time.Duration(req.GraceSeconds) * time.Second
		if req.GraceSeconds < 0 || grace > MaxRotationGrace {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("grace_seconds %d: give 0 to %d (%s)", req.GraceSeconds, int64(MaxRotationGrace/time.Second), MaxRotationGrace))
			return
		}
		if req.By == "" {
			req.By = "an operator"
		}
		var info fleetsecret.RecordInfo
		var err error
		switch step {
		case "begin":
			info, err = sf.BeginRotation(r.Context(), req.By)
		case "sign":
			info, err = sf.SignWithNew(r.Context(), req.By)
		default:
			info, err = sf.FinishRotation(r.Context(), req.By, grace)
		}
		if errors.Is(err, fleetsecret.ErrRotationRefused) {
			writeError(w, http.StatusConflict, err.Error())
			return
		}
		if err != nil {
			h.log.Warn("secret rotation", logkey.Step, step, attrError, err)
			writeFleetError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, secretRecordFrom(info))
	}
}

// SecretStatus returns the fleet secret's status as the relay answering
// sees it.
func (c *Client) SecretStatus(ctx context.Context) (SecretStatus, error) {
	var out SecretStatus
	err := c.do(ctx, http.MethodGet, PathSecret, nil, http.StatusOK, &out)
	return out, err
}

// BeginRotation adds a new secret, accepted only, or finds the rotation in
// progress. A refusal is an *APIError with Status 409.
func (c *Client) BeginRotation(ctx context.Context, by string) (SecretRecord, error) {
	var out SecretRecord
	err := c.do(ctx, http.MethodPost, PathRotation, RotationStep{By: by}, http.StatusOK, &out)
	return out, err
}

// SignWithNewSecret makes the rotation's new secret the signing one.
func (c *Client) SignWithNewSecret(ctx context.Context, by string) (SecretRecord, error) {
	var out SecretRecord
	err := c.do(ctx, http.MethodPost, PathRotation+"/sign", RotationStep{By: by}, http.StatusOK, &out)
	return out, err
}

// FinishRotation drops the old secret, or keeps it accepted for grace.
func (c *Client) FinishRotation(ctx context.Context, by string, grace time.Duration) (SecretRecord, error) {
	var out SecretRecord
	err := c.do(ctx, http.MethodPost, PathRotation+"/finish", RotationStep{By: by, GraceSeconds: int64(grace / time.Second)}, http.StatusOK, &out)
	return out, err
}
