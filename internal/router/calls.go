package router

import (
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// Calls routes the calls of long-poll agents that reach this relay from
// the agents themselves (a forward from another relay is served where it
// arrives): a poll goes to the relay that should hold the device, so that
// a drain moves long-poll agents too; an answer goes to the relay whose
// broker made the request, else to where the device is now.
type Calls struct {
	// Requests leaves out the relays this relay must not forward to.
	Requests Directory
	// Polls leaves out those and the relays no agent should be placed on:
	// a poll is both forwarded and placed.
	Polls  Directory
	Owners Owners
	Status Status
	// KeepArrivingAgents: the front door places devices, and a poll is
	// held where it arrives while the relay does not drain.
	KeepArrivingAgents bool
}

// CallAction is what becomes of an agent's call.
type CallAction uint8

const (
	// Serve serves the call here.
	Serve CallAction = iota
	// Forward forwards the call, as it is, to the relay To.
	Forward
	// ForwardPoll forwards the poll to the relay To, in a way that a
	// shutdown here ends without losing a request.
	ForwardPoll
	// TurnAway answers 503: this relay stops, and the agent polls another.
	TurnAway
)

// Call is the route of one call.
type Call struct {
	Action CallAction
	To     fleet.Target
}

// Route returns the route of a call for device: a poll when requestID is
// empty, else the answer (or the request stream) of that request.
func (c *Calls) Route(device, requestID string) Call {
	if requestID != "" {
		if owner, ok := c.Owners.RelayByIDHex(wire.RequestOwner(requestID)); ok && !owner.Self && owner.Address != "" {
			return Call{Action: Forward, To: owner}
		}
		if t, ok := c.Requests.Route(device, ""); ok && !t.Self && t.Address != "" {
			return Call{Action: Forward, To: t}
		}
		return Call{Action: Serve}
	}
	if c.Status.Stopping() {
		if t, ok := c.Polls.Holder(device, ""); !ok || t.Self {
			return Call{Action: Serve} // no other relay: the broker holds the poll, then answers 408
		}
		// Not held here, not forwarded from here: a stopping relay must
		// become idle. The agent polls again, through another relay.
		return Call{Action: TurnAway}
	}
	if c.KeepArrivingAgents && !c.Status.Draining() {
		return Call{Action: Serve} // the front door chose this relay for the device: hold the poll here
	}
	if t, ok := c.Polls.Holder(device, ""); ok && !t.Self && t.Address != "" {
		return Call{Action: ForwardPoll, To: t}
	}
	return Call{Action: Serve}
}
