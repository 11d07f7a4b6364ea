package broker

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/switchboard-relay/switchboard/internal/httperr"
)

// Error is a failure a user or agent should see as an HTTP status: the
// relay's one status error.
type Error = httperr.Error

// Agent-facing errors, matched with errors.Is.
var (
	// ErrPollTimeout: no request arrived within the poll wait (408).
	ErrPollTimeout = errors.New("no request within the poll wait")
	// ErrPollEnded, as the cause of a poll's context, ends the poll without a
	// request and without counting its agent as gone: the relay that
	// forwarded the poll asked for its end (408 to the poll).
	ErrPollEnded = errors.New("the forwarding relay ended the poll")
	// ErrDraining: the relay is shutting down and hands out no more requests (408 to polls, 503 to users).
	ErrDraining = errors.New("relay is draining")
	// ErrUnknownRequest: the request id is unknown or its user went away (400/410).
	ErrUnknownRequest = errors.New("unknown or finished request id")
	// ErrNotYours: the request was handed to another agent credential (403).
	ErrNotYours = errors.New("request belongs to another agent")
	// ErrStreamClosed: the user closed its side of an upgraded stream (410).
	ErrStreamClosed = errors.New("user stream closed")
	// ErrNoAgent: the device has no agent connected (503).
	ErrNoAgent = errors.New("no agent connected")
	// ErrPickup: the request was queued (its body read) but no agent took
	// it in time (503); it also matches ErrNoAgent.
	ErrPickup = errors.New("no agent picked up the request")
	// errPickup is the cause of a pickup failure: it matches ErrPickup and
	// ErrNoAgent.
	errPickup = errors.Join(ErrNoAgent, ErrPickup)
	// ErrTimeout: the agent did not answer in time (504).
	ErrTimeout = errors.New("agent did not answer in time")
)

// NoAgentError is the error for a device without an agent.
func NoAgentError(device string) error { return noAgentError(device) }

func noAgentError(device string) error {
	return &Error{Status: http.StatusServiceUnavailable, Err: ErrNoAgent, RetryAfter: 5 * time.Second,
		Message: fmt.Sprintf("device %q has no agent connected to this relay; start its agent or check its logs", device)}
}

// movedError hands a request no agent took back to its router: the device
// moved to another relay. It matches ErrNoAgent, not ErrPickup.
func movedError(device string) error {
	return &Error{Status: http.StatusServiceUnavailable, Err: ErrNoAgent, RetryAfter: time.Second,
		Message: fmt.Sprintf("device %q moved to another relay before its agent took the request", device)}
}

func pickupError(device string, waited time.Duration) error {
	return &Error{Status: http.StatusServiceUnavailable, Err: errPickup, RetryAfter: time.Second,
		Message: fmt.Sprintf("no agent for device %q picked up the request within %v", device, waited.Round(time.Millisecond))}
}

func drainingError() error {
	return &Error{Status: http.StatusServiceUnavailable, Err: ErrDraining, RetryAfter: time.Second,
		Message: "this relay is shutting down; retry in a moment"}
}

func timeoutError(device string, d time.Duration, what string) error {
	return &Error{Status: http.StatusGatewayTimeout, Err: ErrTimeout,
		Message: fmt.Sprintf("the agent for device %q sent no %s within %v", device, what, d)}
}
