package fleet

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// TestRouteFollowsAnAgentSentAway: the relay the directory names for a
// device, having sent the device's arriving agent to another relay, routes
// the device's requests there (Final) while the directory still names it;
// it stops when it takes an agent of the device again, or when the
// directory records the device anew.
func TestRouteFollowsAnAgentSentAway(t *testing.T) {
	f := newTestFleet(t)
	a, b := f.join(), f.join()
	a.local.set("robot", Presence{Agents: 1, Protocol: "native"})
	a.m.Changed()
	routes := func(m *Member, want string) func() error {
		return func() error {
			if tg, ok := m.Route("robot", "", nil, ""); !ok || tg.ID != want {
				return fmt.Errorf("route from %s = %+v, %v; want %s", m.ID(), tg, ok, want)
			}
			return nil
		}
	}
	waitHeld(t, "robot", a.m, a.m, b.m)

	// a sends the agent on to b; the directory still names a.
	a.local.set("robot", Presence{})
	a.m.NoteSent("robot", b.m.ID())
	tg, ok := a.m.Route("robot", "", nil, "")
	if !ok || tg.ID != b.m.ID() || !tg.Final {
		t.Fatalf("route on the relay that sent the agent away = %+v, %v; want %s, final", tg, ok, b.m.ID())
	}
	if tg, _ := a.m.Route("robot", "", nil, b.m.ID()); tg.ID == b.m.ID() {
		t.Errorf("route excluding %s = %+v", b.m.ID(), tg)
	}
	if tg, _ := a.m.Route("robot", "", func(id string) bool { return id == b.m.ID() }, ""); tg.ID == b.m.ID() {
		t.Errorf("route with %s vetoed = %+v", b.m.ID(), tg)
	}

	// An agent of the device comes back to a: a serves it again.
	a.m.NoteTaken("robot")
	if tg, _ := a.m.Route("robot", "", nil, ""); !tg.Self {
		t.Errorf("route after the agent came back = %+v, want this relay", tg)
	}

	// Sent away again, and b records the device: the directory leads.
	a.m.NoteSent("robot", b.m.ID())
	b.local.set("robot", Presence{Agents: 1, Protocol: "native"})
	b.m.Changed()
	eventually(t, 5*time.Second, routes(a.m, b.m.ID()))
	eventually(t, 5*time.Second, func() error {
		a.m.forgetSent()
		a.m.sentMu.Lock()
		defer a.m.sentMu.Unlock()
		if len(a.m.sent) != 0 {
			return fmt.Errorf("a still remembers %v", a.m.sent)
		}
		return nil
	})
}

// TestSentAwayEndsWhenTheDeviceComesBack: a note older than the
// directory's attachment of the device to this relay is not followed.
func TestSentAwayEndsWhenTheDeviceComesBack(t *testing.T) {
	a, b := robotHeldByFirst(t)
	a.m.NoteSent("robot", b.m.ID())
	d, _ := a.m.devices.Get(deviceKey("robot"))
	d.AttachedAt = now().Add(time.Second) // recorded here again after the note
	if _, ok := a.m.sentTo("robot", d, a.m.view(time.Now()), nil, ""); ok {
		t.Error("a note older than the device's attachment here was followed")
	}
	a.m.sentMu.Lock()
	defer a.m.sentMu.Unlock()
	if _, ok := a.m.sent["robot"]; ok {
		t.Error("the stale note was kept")
	}
}

// TestRouteFollowsAnAgentTakenElsewhere: a relay that takes an agent of a
// device the directory names another relay for tells that relay at once,
// which then routes the device's requests to it before the directory
// records the move.
func TestRouteFollowsAnAgentTakenElsewhere(t *testing.T) {
	a, b := robotHeldByFirst(t)
	a.local.set("robot", Presence{})
	b.m.NoteTaken("robot") // b's write of the move is still to come
	eventually(t, 5*time.Second, func() error {
		if tg, ok := a.m.Route("robot", "", nil, ""); !ok || tg.ID != b.m.ID() || !tg.Final {
			return fmt.Errorf("route on %s = %+v, %v; want %s, final", a.m.ID(), tg, ok, b.m.ID())
		}
		return nil
	})
}

// waitHeld waits until every member sees every other and device recorded
// on holder.
func waitHeld(t *testing.T, device string, holder *Member, members ...*Member) {
	t.Helper()
	eventually(t, 5*time.Second, func() error {
		for _, m := range members {
			if d, ok := m.devices.Get(deviceKey(device)); !ok || d.RelayID != holder.ID() {
				return fmt.Errorf("%s does not see %s on %s yet", m.ID(), device, holder.ID())
			}
			for _, o := range members {
				if _, ok := m.relays.Get(o.ID()); !ok {
					return fmt.Errorf("%s does not see %s yet", m.ID(), o.ID())
				}
			}
		}
		return nil
	})
}

// TestRouteKeepsAHolderThatAnswers: a holder whose heartbeats stop reaching
// NATS keeps its devices' requests while this relay hears from it
// directly, and loses them once it does not.
func TestRouteKeepsAHolderThatAnswers(t *testing.T) {
	f := newTestFleet(t)
	var answering atomic.Bool
	answering.Store(true)
	a := f.join(func(c *Config) { c.Answering = func(string) bool { return answering.Load() } })
	b := f.join()
	b.local.set("robot", Presence{Agents: 1, Protocol: "native"})
	b.m.Changed()
	waitHeld(t, "robot", b.m, a.m, b.m)
	b.kill() // its beats stop; it still serves its agents
	eventually(t, 5*time.Second, func() error {
		for _, r := range a.m.Relays() {
			if r.ID == b.m.ID() && r.Fresh {
				return fmt.Errorf("%s still fresh", r.ID)
			}
		}
		return nil
	})
	if tg, ok := a.m.Route("robot", "", nil, ""); !ok || tg.ID != b.m.ID() {
		t.Errorf("route to a holder that answers but beats no more = %+v, %v; want %s", tg, ok, b.m.ID())
	}
	answering.Store(false)
	if tg, _ := a.m.Route("robot", "", nil, ""); tg.ID == b.m.ID() {
		t.Errorf("route to a holder neither beating nor answering = %+v", tg)
	}
}

// robotHeldByFirst returns two relays of a fleet, the first holding
// "robot" in both's view.
func robotHeldByFirst(t *testing.T) (a, b *node) {
	f := newTestFleet(t)
	a, b = f.join(), f.join()
	a.local.set("robot", Presence{Agents: 1, Protocol: "native"})
	a.m.Changed()
	waitHeld(t, "robot", a.m, a.m, b.m)
	return a, b
}

// TestRouteFollowsAMoveItIsToldOf: the relay that a move's cancel message
// names as the device's old holder (the new holder wrote the move, which
// this relay's mirror does not show yet) routes the device's requests to
// the new holder at once.
func TestRouteFollowsAMoveItIsToldOf(t *testing.T) {
	a, b := robotHeldByFirst(t)
	a.local.set("robot", Presence{})
	b.m.publishCancel(cancelMsg{Device: "robot", RelayID: a.m.ID(), Reason: "the device moved to relay " + b.m.ID(), Moved: true, Promoted: true, By: b.m.ID()})
	eventually(t, 5*time.Second, func() error {
		if tg, ok := a.m.Route("robot", "", nil, ""); !ok || tg.ID != b.m.ID() || !tg.Final {
			return fmt.Errorf("route on %s = %+v, %v; want %s, final", a.m.ID(), tg, ok, b.m.ID())
		}
		return nil
	})
}
