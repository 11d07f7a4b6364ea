package router

import (
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// Placer decides where a native agent of a device belongs: here when this
// relay holds the device, or should take it, else the holder, to which the
// agent is redirected.
type Placer struct {
	// Self is this relay's id.
	Self string
	// Directory leaves out the relays no agent should be placed on.
	Directory Directory
	// Ranker lists, with the same relays left out, the relays the agent
	// walks when it loses this one.
	Ranker Ranker
	Status Status
	// KeepArrivingAgents: the front door places devices, and the relay an
	// agent reaches keeps it (see Place).
	KeepArrivingAgents bool
}

// Arrival is what an arriving agent's handshake says of its way here.
type Arrival struct {
	// Redirected: the agent follows another relay's redirect.
	Redirected bool
	// Unreachable names the relay the agent lost and could not reach, or "".
	Unreachable string
}

// Place says where an agent of device that arrives so belongs. An agent
// that follows a redirect is taken wherever it lands; one that names the
// relay it lost as unreachable has that relay left out for its device
// alone (the relay is not vetoed for anyone else). A relay that drains or
// stops takes no redirected agent.
//
// With KeepArrivingAgents the relay takes every agent while it does not
// drain or stop, and lists no relays: the front door chose this relay for
// the device, and the agent comes back through the front door. A leaving
// relay refuses the agent instead of redirecting it past the front door.
func (p *Placer) Place(device string, a Arrival) tunnel.Placement {
	pl := tunnel.Placement{RelayID: p.Self}
	draining := leaving(p.Status)
	if p.KeepArrivingAgents {
		if draining {
			// The front door follows /readyz, which is false by now: the
			// agent's next try through it reaches another relay.
			pl.Refuse = "this relay is draining; connect again through the front door"
		}
		return pl
	}
	for _, t := range p.Ranker.Ranked(device) {
		pl.Relays = append(pl.Relays, tunnel.RelayAddr{ID: t.ID, URL: t.Address})
	}
	if a.Redirected && !draining {
		return pl
	}
	if t, ok := p.Directory.Holder(device, a.Unreachable); ok && !t.Self && t.Address != "" {
		pl.Redirect, pl.Holder = t.Address, t.ID
	}
	return pl
}

// Here reports whether pl takes the agent on this relay.
func Here(pl tunnel.Placement) bool { return pl.Refuse == "" && pl.Redirect == "" }
