package fleet

import "time"

// A relay's freshness is judged against the moment up to which this relay's
// mirror of the relay set is known to be current, not against the wall
// clock. The mirror says so itself: this relay's own heartbeats come back
// through the same watch as everybody else's, every beat interval. While
// they keep arriving, the mirror is current and a peer's heartbeat age is
// its age now. When they stop arriving — NATS unreachable, a cluster that
// lost its quorum and takes no writes, a watch that delivers nothing — the
// mirror is frozen at this relay's last beat, and so is every peer's age:
// a peer that was beating then still counts as fresh, and the watchdog alone
// says whether it answers. See docs/design/fleet-state.md.

// view is the relay set as this relay's mirror holds it, judged at one moment.
type view struct {
	at     time.Time     // the mirror is known current up to here
	window time.Duration // Config.FreshAfter
}

// viewAt returns the moment up to which a mirror of the relay set is known
// current, given the time now and this relay's own last heartbeat as the
// mirror holds it (ok false when it holds none): now while the next beat is
// not yet due, else the moment that beat was due. A mirror without this
// relay's record (a NATS server restarted empty, before the relay beat
// again) cannot tell, and is taken as current.
func viewAt(now, ownBeat time.Time, ok bool, interval time.Duration) time.Time {
	if !ok {
		return now
	}
	if due := ownBeat.Add(interval); due.Before(now) {
		return due
	}
	return now
}

// age is how old a heartbeat sent at lastSeen was when the view was current.
func (v view) age(lastSeen time.Time) time.Duration { return v.at.Sub(lastSeen) }

// fresh reports whether a heartbeat sent at lastSeen is fresh in the view.
func (v view) fresh(lastSeen time.Time) bool { return v.age(lastSeen) <= v.window }

// view returns this relay's view of the relay set at now. It takes the
// mirror's lock: call it before taking that lock, never under it.
func (m *Member) view(now time.Time) view {
	own, ok := m.relays.Get(m.cfg.RelayID)
	return view{at: viewAt(now, own.LastSeenAt, ok, m.cfg.BeatInterval), window: m.cfg.FreshAfter}
}

// HeartbeatAge returns how old a heartbeat sent at lastSeen is in this
// relay's view of the fleet: its age now while the view is current, its age
// when the view froze while NATS is away.
func (m *Member) HeartbeatAge(lastSeen time.Time) time.Duration {
	return m.view(time.Now()).age(lastSeen)
}
