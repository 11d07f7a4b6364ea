// Package control serves a relay's admin listener: liveness and readiness
// probes, Prometheus metrics and the operator API (HTTP and JSON, behind the
// admin bearer token), and provides the Client that the ctl command uses to
// call that API. The operator API is the same on every relay: the state it
// reads and changes lives in NATS, not in the relay that answers. Its JSON
// is this package's types (contract.go), filled from the fleet's views at
// the edge: the contract that 'switchboard ctl -o json' prints and
// docs/cli-json.md documents.
package control

import (
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
)

// Paths of the admin listener.
const (
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathMetrics = "/metrics"
	// PathDebugProfiles serves Go's runtime profiles (net/http/pprof).
	PathDebugProfiles = "/debug/pprof/"
	PathTokens        = "/api/v1/tokens"
)

// MaxBodyBytes is the largest request body the operator API reads.
const MaxBodyBytes = 1 << 20

// MaxAnswerBytes is the largest answer the Client reads. A device list is
// about 250 bytes a device, so this holds a fleet of about 250,000; an
// error answer is read up to MaxBodyBytes.
const MaxAnswerBytes = 64 << 20

// TokenRequest is the body of POST /api/v1/tokens.
type TokenRequest struct {
	// Kind is "agent" (serves devices) or "user" (uses devices).
	Kind auth.Kind `json:"kind"`
	// Name says who holds the token; required for user tokens.
	Name string `json:"name,omitempty"`
	// Devices are device names or globs such as "robot-*": those an agent may
	// serve (at least one), or those a user may use (none means all).
	Devices []string `json:"devices,omitempty"`
}

// CreatedToken answers POST /api/v1/tokens. It is the only time the secret
// is shown.
type CreatedToken struct {
	ID        string    `json:"id"`
	Token     string    `json:"token"` // the secret the bearer presents
	Kind      auth.Kind `json:"kind"`
	Name      string    `json:"name"`
	Devices   []string  `json:"devices"`
	CreatedAt time.Time `json:"created_at"`
}

// Token describes a token in GET /api/v1/tokens, without its secret.
type Token struct {
	ID        string    `json:"id"`
	Kind      auth.Kind `json:"kind"`
	Name      string    `json:"name"`
	Devices   []string  `json:"devices"`
	CreatedAt time.Time `json:"created_at"`
	Revoked   bool      `json:"revoked"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// errorBody is the JSON body of every operator API error.
type errorBody struct {
	Error string `json:"error"`
}

func tokenFromAuth(t auth.Token) Token {
	return Token{
		ID: t.ID, Kind: t.Kind, Name: t.Name, Devices: nonNil(t.Devices),
		CreatedAt: t.CreatedAt, Revoked: t.Revoked, RevokedAt: t.RevokedAt,
	}
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
