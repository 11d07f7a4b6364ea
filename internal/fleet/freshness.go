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

//
// When the mirror thaws (this relay's beats come back through it), the
// peers' next beats are still on their way: their last ones, from before
// the freeze, would look as old as the outage was long, and every peer
// would turn stale (or lost, or reapable) for the moment until it beats
// again. So the time the mirror was frozen does not count toward any
// silence that began before it, nor does the time the peers take to come
// back (ThawGrace): a peer that was fresh when the view froze is fresh when
// it thaws, and has ThawGrace and then its fresh window to beat again.

// view is the relay set as this relay's mirror holds it, judged at one moment.
type view struct {
	at     time.Time     // the mirror is known current up to here
	window time.Duration // Config.FreshAfter
	// frozen is the mirror's last freeze that ended, if any: a silence
	// that began before it is shorter by its length.
	frozen *freeze
}

// freeze is a stretch of time the mirror of the relay set was not current.
type freeze struct{ from, to time.Time }

// thawed returns the freeze shown by this relay's own heartbeat moving from
// prev to next in the mirror, or nil when no beat was missed in between.
func thawed(prev, next time.Time, interval time.Duration) *freeze {
	from := prev.Add(interval) // when the mirror froze: the beat after prev was due
	if next.Sub(prev) <= 2*interval || !next.After(from) {
		return nil
	}
	return &freeze{from: from, to: next}
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

// ThawGrace is how long after a thaw a peer's silence that began before the
// freeze stays as long as it was when the view froze: the time the peers
// take to reach NATS again and beat (nats.go retries a lost server every
// 2 s, and each relay's connection comes back on its own schedule). The
// watchdog's probes, not heartbeats, say meanwhile whether a peer answers.
const ThawGrace = 5 * time.Second

// age is how old a heartbeat sent at lastSeen was when the view was current,
// not counting the time the view was frozen since, nor, for a silence that
// began before the freeze, up to ThawGrace after it.
func (v view) age(lastSeen time.Time) time.Duration {
	a := v.at.Sub(lastSeen)
	if f := v.frozen; f != nil && lastSeen.Before(f.from) && !v.at.Before(f.to) {
		a -= f.to.Sub(f.from) + min(v.at.Sub(f.to), ThawGrace)
	}
	return a
}

// fresh reports whether a heartbeat sent at lastSeen is fresh in the view.
func (v view) fresh(lastSeen time.Time) bool { return v.age(lastSeen) <= v.window }

// view returns this relay's view of the relay set at now. It takes the
// mirror's lock: call it before taking that lock, never under it.
func (m *Member) view(now time.Time) view {
	own, ok := m.relays.Get(m.cfg.RelayID)
	return view{at: viewAt(now, own.LastSeenAt, ok, m.cfg.BeatInterval), window: m.cfg.FreshAfter, frozen: m.frozen.Load()}
}

// noteOwnBeat records, as this relay's heartbeat moves from prev to next in
// its mirror, the freeze the move ends, if it ends one.
func (m *Member) noteOwnBeat(prev, next *Relay) {
	if prev == nil || next == nil || next.ID != m.cfg.RelayID {
		return
	}
	if f := thawed(prev.LastSeenAt, next.LastSeenAt, m.cfg.BeatInterval); f != nil {
		m.frozen.Store(f)
	}
}

// HeartbeatAge returns how old a heartbeat sent at lastSeen is in this
// relay's view of the fleet: its age now while the view is current, its age
// when the view froze while NATS is away.
func (m *Member) HeartbeatAge(lastSeen time.Time) time.Duration {
	return m.view(time.Now()).age(lastSeen)
}
