package router

import (
	"slices"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// ranked is a Ranker that gives every device the same list.
type ranked []fleet.Target

func (r ranked) Ranked(string) []fleet.Target { return r }

// owners is an Owners over a map by the 8 hex digits.
type owners map[string]fleet.Target

func (o owners) RelayByIDHex(hex8 string) (fleet.Target, bool) {
	t, ok := o[hex8]
	return t, ok
}

var (
	_ Ranker = ranked{}
	_ Owners = owners{}
)

// TestPlace is the table of where a native agent is placed: here, or
// redirected to the holder, and the relay list it is given.
func TestPlace(t *testing.T) {
	list := []tunnel.RelayAddr{{ID: r3.ID, URL: r3.Address}, {ID: self.ID, URL: self.Address}}
	for _, c := range []struct {
		name    string
		state   *fakeState
		keep    bool
		arrival Arrival
		want    tunnel.Placement
	}{
		{"the holder is this relay", &fakeState{holders: map[string]fleet.Target{"": self}}, false, Arrival{},
			tunnel.Placement{Relays: list}},
		{"the holder is another relay", &fakeState{holders: map[string]fleet.Target{"": r3}}, false, Arrival{},
			tunnel.Placement{Redirect: r3.Address, Holder: r3.ID, Relays: list}},
		{"no relay is available", &fakeState{}, false, Arrival{},
			tunnel.Placement{Relays: list}},
		{"the holder advertises no address", &fakeState{holders: map[string]fleet.Target{"": {ID: r3.ID}}}, false, Arrival{},
			tunnel.Placement{Relays: list}},
		{"redirected here: taken", &fakeState{holders: map[string]fleet.Target{"": r3}}, false, Arrival{Redirected: true},
			tunnel.Placement{Relays: list}},
		{"redirected to a draining relay: sent on", &fakeState{draining: true, holders: map[string]fleet.Target{"": r3}}, false, Arrival{Redirected: true},
			tunnel.Placement{Redirect: r3.Address, Holder: r3.ID, Relays: list}},
		{"redirected to a stopping relay: sent on", &fakeState{stopping: true, holders: map[string]fleet.Target{"": r3}}, false, Arrival{Redirected: true},
			tunnel.Placement{Redirect: r3.Address, Holder: r3.ID, Relays: list}},
		{"the lost relay is left out for this device", &fakeState{holders: map[string]fleet.Target{"": r2, r2.ID: self}}, false, Arrival{Unreachable: r2.ID},
			tunnel.Placement{Relays: list}},
		{"the front door places: kept", &fakeState{holders: map[string]fleet.Target{"": r3}}, true, Arrival{},
			tunnel.Placement{}},
		{"the front door places, this relay drains: refused", &fakeState{draining: true, holders: map[string]fleet.Target{"": r3}}, true, Arrival{},
			tunnel.Placement{Refuse: "this relay is draining; connect again through the front door"}},
		{"the front door places, this relay stops: refused", &fakeState{stopping: true}, true, Arrival{Redirected: true},
			tunnel.Placement{Refuse: "this relay is draining; connect again through the front door"}},
	} {
		p := &Placer{Self: self.ID, Directory: fakeDirectory{c.state}, Ranker: ranked{r3, self}, Status: c.state, KeepArrivingAgents: c.keep}
		got := p.Place("dev", c.arrival)
		c.want.RelayID = self.ID
		if got.Redirect != c.want.Redirect || got.Holder != c.want.Holder || got.RelayID != c.want.RelayID ||
			got.Refuse != c.want.Refuse || !slices.Equal(got.Relays, c.want.Relays) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if here := c.want.Redirect == "" && c.want.Refuse == ""; Here(got) != here {
			t.Errorf("%s: Here %v, want %v", c.name, Here(got), here)
		}
	}
}

// TestCalls is the table of where a long-poll agent's call goes: polls to
// the device's holder, answers to the relay that made the request.
func TestCalls(t *testing.T) {
	const answer = "dev:00000002" + "0123456789abcdef0123456789ab" // made by rl-00000002
	for _, c := range []struct {
		name      string
		state     *fakeState
		keep      bool
		requestID string
		want      Call
	}{
		{"a poll, held here", &fakeState{holders: map[string]fleet.Target{"": self}}, false, "", Call{Action: Serve}},
		{"a poll, held elsewhere", &fakeState{holders: map[string]fleet.Target{"": r3}}, false, "", Call{Action: ForwardPoll, To: r3}},
		{"a poll, no relay available", &fakeState{}, false, "", Call{Action: Serve}},
		{"a poll, the holder has no address", &fakeState{holders: map[string]fleet.Target{"": {ID: r3.ID}}}, false, "", Call{Action: Serve}},
		{"a poll, routed by the directory yet placed here", &fakeState{routes: map[string]fleet.Target{"": r2}, holders: map[string]fleet.Target{"": self}}, false, "", Call{Action: Serve}},
		{"a poll at a stopping relay, held here", &fakeState{stopping: true, holders: map[string]fleet.Target{"": self}}, false, "", Call{Action: Serve}},
		{"a poll at a stopping relay, no relay available", &fakeState{stopping: true}, false, "", Call{Action: Serve}},
		{"a poll at a stopping relay, held elsewhere", &fakeState{stopping: true, holders: map[string]fleet.Target{"": r3}}, false, "", Call{Action: TurnAway}},
		{"a poll at a stopping relay, behind a front door", &fakeState{stopping: true, holders: map[string]fleet.Target{"": r3}}, true, "", Call{Action: TurnAway}},
		{"a poll behind a front door", &fakeState{holders: map[string]fleet.Target{"": r3}}, true, "", Call{Action: Serve}},
		{"a poll behind a front door, this relay drains", &fakeState{draining: true, holders: map[string]fleet.Target{"": r3}}, true, "", Call{Action: ForwardPoll, To: r3}},
		{"an answer, to the relay that made the request", &fakeState{routes: map[string]fleet.Target{"": r3}}, false, answer, Call{Action: Forward, To: r2}},
		{"an answer, its maker stopping", &fakeState{stopping: true, routes: map[string]fleet.Target{"": self}}, false, answer, Call{Action: Forward, To: r2}},
		{"an answer made by an unknown relay goes to the device", &fakeState{routes: map[string]fleet.Target{"": r3}}, false, "dev:00000009" + "0123456789abcdef0123456789ab", Call{Action: Forward, To: r3}},
		{"an answer made here", &fakeState{routes: map[string]fleet.Target{"": r3}}, false, "dev:00000001" + "0123456789abcdef0123456789ab", Call{Action: Forward, To: r3}},
		{"an answer for a device routed here", &fakeState{routes: map[string]fleet.Target{"": self}}, false, "dev:00000001" + "0123456789abcdef0123456789ab", Call{Action: Serve}},
		{"a short request id", &fakeState{routes: map[string]fleet.Target{"": self}}, false, "dev:0002", Call{Action: Serve}},
	} {
		calls := &Calls{
			Requests: fakeDirectory{c.state}, Polls: fakeDirectory{c.state},
			Owners: owners{"00000001": self, "00000002": r2}, Status: c.state, KeepArrivingAgents: c.keep,
		}
		if got := calls.Route("dev", c.requestID); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
