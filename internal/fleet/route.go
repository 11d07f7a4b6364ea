package fleet

import (
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/ranking"
)

// Target is the relay that holds, or should take, a device.
type Target struct {
	ID      string
	Address string // the relay's advertised URL
	Self    bool   // this relay
	// Final marks a relay chosen because the device's agent is on its way
	// there: a request sent to it waits there rather than going on.
	Final bool
}

// scratch recycles the candidate slices of Holder.
var scratch = sync.Pool{New: func() any { s := make([]ranking.Relay, 0, 16); return &s }}

// RelayByIDHex returns the relay whose id is "rl-" and hex8.
func (m *Member) RelayByIDHex(hex8 string) (Target, bool) {
	if len(hex8) != 8 {
		return Target{}, false
	}
	r, ok := m.relays.Get("rl-" + hex8)
	if !ok {
		return Target{}, false
	}
	return m.target(r), true
}

// Known reports whether the directory has an entry for device: it had an
// agent somewhere in the fleet, and has not been reaped.
func (m *Member) Known(device string) bool {
	_, ok := m.devices.Get(deviceKey(device))
	return ok
}

// Route returns the relay a user's request for device should go to: the
// relay recorded in the directory while its agents are there and it
// answers (ranking.State.Answers: fresh, healthy, not vetoed, not
// excluded), even when it drains —
// a drain moves nothing mid-flight, and users follow the agents as they
// move — else Holder's choice. A recorded relay whose heartbeats no
// longer reach NATS (it cannot write, but this relay's view is current)
// answers while this relay hears from it directly (Config.Answering): its
// agents are still there. On the relay recorded, which an agent of the
// device left for another relay since (NoteSent), it is that relay while it
// answers, marked Final: the directory has yet to record the move.
func (m *Member) Route(device, region string, vetoed func(id string) bool, exclude string) (Target, bool) {
	if d, found := m.devices.Get(deviceKey(device)); found {
		v := m.view(time.Now())
		if d.RelayID == m.cfg.RelayID {
			if t, ok := m.sentTo(device, d, v, vetoed, exclude); ok {
				return t, true
			}
		}
		if r, ok := m.relays.Get(d.RelayID); ok && d.Agents > 0 {
			st := v.state(r, vetoed, exclude)
			st.Fresh = st.Fresh || r.ID != m.cfg.RelayID && m.cfg.Answering(r.ID)
			if st.Answers() {
				return m.target(r), true
			}
		}
	}
	return m.Holder(device, region, vetoed, exclude)
}

// state is what decides whether relay r is available in view v (see
// ranking.State): vetoed, when set, and exclude leave relays out.
func (v view) state(r Relay, vetoed func(id string) bool, exclude string) ranking.State {
	return ranking.State{
		Fresh: v.fresh(r.LastSeenAt), Healthy: r.Healthy, Draining: r.Draining, Stopping: r.Stopping,
		Vetoed: r.ID == exclude && exclude != "" || vetoed != nil && vetoed(r.ID),
	}
}

func (m *Member) target(r Relay) Target {
	addr := ""
	if len(r.Addresses) > 0 {
		addr = r.Addresses[0]
	}
	return Target{ID: r.ID, Address: addr, Self: r.ID == m.cfg.RelayID}
}

// Holder returns the relay that should serve device now: the relay recorded
// in the directory while it is available (sticky), else the recorded
// standby while it is available, else the best available relay by the
// ranking. A relay is available as ranking.State.Available
// says: fresh, healthy, not draining or stopping, not vetoed, and not
// excluded (an agent reported it unreachable). ok is false when no relay is
// available.
func (m *Member) Holder(device, region string, vetoed func(id string) bool, exclude string) (t Target, ok bool) {
	v := m.view(time.Now())
	current, standby := "", ""
	if d, found := m.devices.Get(deviceKey(device)); found {
		current, standby = d.RelayID, d.Standby
	}
	sp := scratch.Get().(*[]ranking.Relay)
	defer scratch.Put(sp)
	cands := (*sp)[:0]
	// This relay knows its own drain or shutdown before its mirror does.
	selfOut := m.shouldDrain.Load() || m.cfg.Local.Stopping()
	m.relays.Range(func(r Relay) bool {
		st := v.state(r, vetoed, exclude)
		st.Draining = st.Draining || selfOut && r.ID == m.cfg.RelayID
		cands = append(cands, ranking.Relay{ID: r.ID, Region: r.Region, Available: st.Available(), Load: m.loads.of(r.ID), Capacity: r.MaxForward})
		return true
	})
	*sp = cands
	if standby != "" && !availableIn(cands, current) {
		// The holder is out (vetoed, draining, gone): the device moves to
		// the relay that keeps its standby tunnel, when that one is in.
		current = standby
	}
	i := ranking.Holder(device, region, current, cands)
	if i < 0 {
		return Target{}, false
	}
	r, _ := m.relays.Get(cands[i].ID)
	return m.target(r), true
}

// availableIn reports whether the relay id is among cands and available.
func availableIn(cands []ranking.Relay, id string) bool {
	for i := range cands {
		if cands[i].ID == id {
			return cands[i].Available
		}
	}
	return false
}

// Ranked returns the available relays, best first for device: the list an
// agent walks when its relay is lost.
func (m *Member) Ranked(device, region string, vetoed func(id string) bool) []Target {
	v := m.view(time.Now())
	var cands []ranking.Relay
	addrs := map[string]string{}
	for _, r := range m.relays.All() {
		cands = append(cands, ranking.Relay{ID: r.ID, Region: r.Region, Available: v.state(r, vetoed, "").Available(), Load: m.loads.of(r.ID), Capacity: r.MaxForward})
		if len(r.Addresses) > 0 {
			addrs[r.ID] = r.Addresses[0]
		}
	}
	order := ranking.Rank(device, region, cands, make([]int, 0, len(cands)))
	out := make([]Target, 0, len(order))
	for _, i := range order {
		id := cands[i].ID
		if a := addrs[id]; a != "" {
			out = append(out, Target{ID: id, Address: a, Self: id == m.cfg.RelayID})
		}
	}
	return out
}

// BucketFleet holds fleet-wide settings: the fleet secret, rolling updates.
const BucketFleet = "switchboard_fleet"

// relayLoads counts, per relay, the devices the directory has attached to
// it (with agents), kept current by the directory mirror so that placing a
// device never scans the directory. The zero value is ready.
type relayLoads struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *relayLoads) reload(items map[string]Attachment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n = map[string]int{}
	for _, a := range items {
		if a.Agents > 0 {
			l.n[a.RelayID]++
		}
	}
}

func (l *relayLoads) apply(old, new *Attachment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = map[string]int{}
	}
	if old != nil && old.Agents > 0 {
		if l.n[old.RelayID]--; l.n[old.RelayID] <= 0 {
			delete(l.n, old.RelayID)
		}
	}
	if new != nil && new.Agents > 0 {
		l.n[new.RelayID]++
	}
}

func (l *relayLoads) of(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[id]
}
