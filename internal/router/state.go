package router

import (
	"net/http"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/fleet"
)

// Directory says where in the fleet a device is served, as this relay's
// mirror of the fleet state has it. Which relays it leaves out (vetoed by
// this relay's watchdog, refusing its fleet secret, ...) is the
// implementation's: each use of the router has its own.
type Directory interface {
	// Route returns the relay a request for device goes to: the relay
	// recorded as holding it while its agents are there and it answers,
	// else Holder's choice. exclude, when set, is left out.
	Route(device, exclude string) (fleet.Target, bool)
	// Holder returns the relay that should hold device now: the one
	// recorded while it is available, else the ranking's best. exclude,
	// when set, is left out.
	Holder(device, exclude string) (fleet.Target, bool)
}

// Ranker lists the relays an agent of a device may go to, best first.
type Ranker interface {
	Ranked(device string) []fleet.Target
}

// Registry reports whether the fleet has seen an agent of a device.
type Registry interface {
	Known(device string) bool
}

// Owners finds the relay whose id is "rl-" and the 8 hex digits given:
// the relay that made a long-poll request id (wire.RequestOwner).
type Owners interface {
	RelayByIDHex(hex8 string) (fleet.Target, bool)
}

// Agents says what this relay knows of its own agents of a device.
type Agents interface {
	// HasAgent reports whether an agent of device here takes requests now.
	HasAgent(device string) bool
	// Remembers reports whether a long-poll agent of device polled here
	// lately: between two polls it is away, not gone.
	Remembers(device string) bool
}

// Status says whether this relay is leaving the fleet.
type Status interface {
	// Draining reports whether an operator, a roll or the relay itself
	// holds it out of placement.
	Draining() bool
	// Stopping reports whether the relay is shutting down.
	Stopping() bool
}

// leaving reports whether the relay of s drains or stops.
func leaving(s Status) bool { return s.Draining() || s.Stopping() }

// Vetoer takes a relay out of routing after a connection to it failed.
type Vetoer interface {
	Veto(relayID string, reason error)
}

// Changes hands out a channel closed at the next change of this relay's
// agents or of the fleet state, to wait on.
type Changes interface {
	Changed() <-chan struct{}
}

// Spender records the use of an access code's ticket and refuses a ticket
// spent before.
type Spender interface {
	Spend(access.Ticket) error
}

// ForwardObserver is told of each forward's outcome (for metrics).
type ForwardObserver interface {
	Forwarded(relayID string, err error)
}

// StreamForwarder sends a request to the device's agent at the relay
// holding it over a stream the holder splices, parsing no HTTP (package
// forward). An error wrapping forward.ErrUnavailable means the holder
// serves no such stream now and nothing was sent: the request goes over
// HTTP instead.
type StreamForwarder interface {
	RoundTrip(req *http.Request, holderID, address string) (*http.Response, error)
}
