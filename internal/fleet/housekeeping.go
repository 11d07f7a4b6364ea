package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// housekeeping is the lease holder's memory between sweeps.
type housekeeping struct {
	fresh map[string]bool // each relay's freshness at the last sweep
}

// housekeepingLoop tries for the lease every third of its length and, while
// holding it, sweeps.
func (m *Member) housekeepingLoop(ctx context.Context) {
	t := time.NewTicker(m.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		m.housekeepOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Member) housekeepOnce(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	held, holder, err := acquireLease(octx, m.leaseKV, leaseHousekeeping, m.cfg.RelayID, m.cfg.LeaseTTL)
	cancel()
	if err != nil {
		held = false // without NATS, nobody can sweep
	}
	was := m.leaseHeld.Swap(held)
	switch {
	case held && !was:
		m.log.Info("took the housekeeping lease")
		m.Record(Event{Type: EventLeaseTaken, RelayID: m.cfg.RelayID, Message: fmt.Sprintf("relay %s runs housekeeping", m.cfg.RelayID)})
		m.hk = housekeeping{fresh: m.lastKnownFreshness()}
	case !held && was:
		m.log.Info("gave up the housekeeping lease", logkey.Holder, holder, logkey.Err, err)
	}
	if held {
		m.sweep(ctx, time.Now())
		m.cfg.Secret.Sweep(ctx, !was)
	}
}

// lastKnownFreshness is a new lease holder's starting point: relays that beat
// within the lost window count as fresh until now, so that one that died with
// the previous holder still raises its stale event.
func (m *Member) lastKnownFreshness() map[string]bool {
	v := m.view(time.Now())
	out := map[string]bool{}
	for _, r := range m.relays.All() {
		out[r.ID] = v.age(r.LastSeenAt) < m.cfg.LostWindow
	}
	return out
}

// sweep raises stale and fresh events, detaches the devices of lost relays,
// and reaps relays and devices abandoned for ReapAfter. Every age is
// measured in this relay's view of the fleet, not against the clock: a
// mirror that stopped receiving (a watch that delivers nothing while writes
// still succeed) ages nobody, so that nothing is declared stale, lost or
// reaped on a frozen picture.
func (m *Member) sweep(ctx context.Context, t time.Time) {
	v := m.view(t)
	devs := m.devices.All()
	attached := map[string][]string{} // relay id → devices with agents
	for _, d := range devs {
		if d.Agents > 0 {
			attached[d.RelayID] = append(attached[d.RelayID], d.Device)
		}
	}
	for _, r := range m.relays.All() {
		age := v.age(r.LastSeenAt)
		fresh := v.fresh(r.LastSeenAt)
		was, known := m.hk.fresh[r.ID]
		m.hk.fresh[r.ID] = fresh
		switch {
		case known && was && !fresh:
			m.Record(Event{Type: EventRelayStale, RelayID: r.ID, DurationMS: msec(age),
				Message: fmt.Sprintf("relay %s missed its heartbeats (last %s ago); its %d device(s) may move", r.ID, age.Round(time.Millisecond), len(attached[r.ID]))})
		case known && !was && fresh:
			m.Record(Event{Type: EventRelayFresh, RelayID: r.ID, Message: fmt.Sprintf("relay %s is beating again", r.ID)})
		}
		switch {
		case age > m.cfg.ReapAfter && len(attached[r.ID]) == 0:
			m.reapRelay(ctx, r, age)
		case age > m.cfg.LostWindow && len(attached[r.ID]) > 0:
			m.detachLost(ctx, r, attached[r.ID], age)
		}
	}
	for _, d := range devs {
		if d.Agents == 0 && v.age(d.UpdatedAt) > m.cfg.ReapAfter {
			m.reapDevice(ctx, d)
		}
	}
}

// detachLost marks the devices of a relay stale beyond the lost window as
// detached: nothing holds them there any more.
func (m *Member) detachLost(ctx context.Context, r Relay, devices []string, age time.Duration) {
	n := 0
	for _, dev := range devices {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		done, err := detach(octx, m.devsKV, r.ID, dev, hint(m.devices, deviceKey(dev)))
		cancel()
		if err == nil && done {
			n++
		}
	}
	if n > 0 {
		m.Record(Event{Type: EventRelayLost, RelayID: r.ID, DurationMS: msec(age),
			Message: fmt.Sprintf("relay %s silent for %s: detached its %d device(s)", r.ID, age.Round(time.Second), n)})
	}
}

func (m *Member) reapRelay(ctx context.Context, r Relay, age time.Duration) {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := m.relaysKV.Get(octx, r.ID)
	var cur Relay
	if err != nil || json.Unmarshal(e.Value(), &cur) != nil || !cur.LastSeenAt.Equal(r.LastSeenAt) {
		return // it beat meanwhile, or is gone already
	}
	// Delete only the revision read: a relay that beats meanwhile stays.
	if err := m.relaysKV.Delete(octx, r.ID, jetstream.LastRevision(e.Revision())); err != nil {
		return
	}
	delete(m.hk.fresh, r.ID)
	m.Record(Event{Type: EventRelayReaped, RelayID: r.ID,
		Message: fmt.Sprintf("relay %s removed: no heartbeat for %s and nothing attached", r.ID, age.Round(time.Second))})
}

func (m *Member) reapDevice(ctx context.Context, d Attachment) {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	key := deviceKey(d.Device)
	e, err := m.devsKV.Get(octx, key)
	var cur Attachment
	if err != nil || json.Unmarshal(e.Value(), &cur) != nil || cur.Agents > 0 || !cur.UpdatedAt.Equal(d.UpdatedAt) {
		return // an agent came back meanwhile, or it is gone already
	}
	if err := m.devsKV.Delete(octx, key, jetstream.LastRevision(e.Revision())); err != nil {
		return
	}
	m.Record(Event{Type: EventDeviceReaped, Device: d.Device, RelayID: d.RelayID,
		Message: fmt.Sprintf("device %s forgotten: no agent since %s", d.Device, d.UpdatedAt.Format(time.RFC3339))})
}

func msec(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
