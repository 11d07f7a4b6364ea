package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestNATSRestartWithoutFiles restarts the fleet's NATS server with an empty
// store: the members keep answering from memory while it is away, then
// re-create the buckets, re-publish their heartbeats and attachments, and
// resync their mirrors from a full read, which also forgets a relay that is
// gone and so never re-published.
func TestNATSRestartWithoutFiles(t *testing.T) {
	t.Parallel()
	first, err := store.Open(testContext(t), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(first.ClientURL())
	f := &testFleet{t: t, urls: []string{first.ClientURL()}, base: fastConfig()}
	logs := &testkit.Buffer{}
	a := f.join(func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	b, c := f.join(), f.join()
	a.local.set("dev-a", Presence{Agents: 1, Protocol: "native"})
	b.local.set("dev-b", Presence{Agents: 2, Protocol: "longpoll"})
	a.m.Changed()
	b.m.Changed()
	for _, n := range []*node{a, b} {
		eventually(t, 5*time.Second, func() error {
			if r, d := len(n.m.Relays()), len(n.m.Devices()); r != 3 || d != 2 {
				return fmt.Errorf("%d relays, %d devices", r, d)
			}
			return nil
		})
	}
	c.kill()

	// NATS goes away: what the members knew is still served.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		if a.m.Status().NATSConnected || logs.Count("fleet state unreachable") == 0 {
			return errors.New("a has not noticed the outage yet")
		}
		return nil
	})
	if r, d := len(a.m.Relays()), len(a.m.Devices()); r != 3 || d != 2 {
		t.Errorf("during the outage a knows %d relays and %d devices, want 3 and 2", r, d)
	}
	if _, err := a.m.Device("dev-b"); err != nil {
		t.Errorf("during the outage: %v", err)
	}

	// It returns on the same address with nothing in it.
	second, err := store.Open(testContext(t), store.Config{DataDir: t.TempDir(), Listen: u.Host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	for _, n := range []*node{a, b} {
		eventually(t, 20*time.Second, func() error {
			rs := n.m.Relays()
			if len(rs) != 2 {
				return fmt.Errorf("%d relays", len(rs))
			}
			for _, r := range rs {
				if r.ID == c.m.ID() {
					return errors.New("the dead relay survived the resync")
				}
			}
			da, errA := n.m.Device("dev-a")
			db, errB := n.m.Device("dev-b")
			if err := errors.Join(errA, errB); err != nil {
				return err
			}
			if da.RelayID != a.m.ID() || db.RelayID != b.m.ID() || db.Agents != 2 {
				return fmt.Errorf("dev-a %+v, dev-b %+v", da, db)
			}
			return nil
		})
	}
	// One log line per transition, not one per retry.
	eventually(t, 5*time.Second, func() error {
		if logs.Count("fleet state reachable again") == 0 {
			return errors.New("no 'reachable again' line yet")
		}
		return nil
	})
	if n := logs.Count("fleet state unreachable"); n != 1 {
		t.Errorf("%d 'unreachable' lines, want 1", n)
	}
	if n := logs.Count("fleet state reachable again"); n != 1 {
		t.Errorf("%d 'reachable again' lines, want 1", n)
	}
}

// TestRoutingOutlivesNATS takes NATS away for longer than the fresh window:
// a relay keeps routing a device to the peer that holds it, as its last
// directory says, keeps listing that peer fresh and offering it to agents,
// and stops only when the caller's veto (the watchdog) says the peer is
// gone. Freshness is judged at the moment the view froze, not by the clock.
func TestRoutingOutlivesNATS(t *testing.T) {
	t.Parallel()
	natsDir := t.TempDir()
	srv, err := store.Open(testContext(t), store.Config{DataDir: natsDir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.ClientURL())
	var back *store.Store // NATS once it returns, closed after the members
	t.Cleanup(func() {
		if back != nil {
			back.Close()
		}
	})
	f := &testFleet{t: t, urls: []string{srv.ClientURL()}, base: fastConfig()}
	a, b := f.join(), f.join()
	b.local.set("dev-b", Presence{Agents: 1, Protocol: "native"})
	b.m.Changed()
	eventually(t, 5*time.Second, func() error {
		if d, err := a.m.Device("dev-b"); err != nil || d.RelayID != b.m.ID() || d.Agents != 1 {
			return fmt.Errorf("dev-b in a's directory: %+v, %v", d, err)
		}
		return nil
	})

	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	// Wait until b's last beat, by the clock, is well past the fresh window.
	last, err := relayOf(a.m, b.m.ID())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		if age := time.Since(last.LastSeenAt); age < 3*f.base.FreshAfter {
			return fmt.Errorf("b's last beat is %s old", age)
		}
		if a.m.Status().NATSConnected {
			return errors.New("a still reaches NATS")
		}
		return nil
	})

	noVeto := func(string) bool { return false }
	if tg, ok := a.m.Route("dev-b", "eu", noVeto, ""); !ok || tg.ID != b.m.ID() {
		t.Errorf("during the outage a routes dev-b to %+v (ok %v), want b %s", tg, ok, b.m.ID())
	}
	if rs, err := relayOf(a.m, b.m.ID()); err != nil || !rs.Fresh {
		t.Errorf("during the outage a lists b as %+v, %v; want fresh", rs, err)
	}
	if d, err := a.m.Device("dev-b"); err != nil || d.State != StateOnline {
		t.Errorf("during the outage a shows dev-b as %+v, %v; want online", d, err)
	}
	if ranked := a.m.Ranked("dev-b", "eu", noVeto); len(ranked) != 2 {
		t.Errorf("during the outage a offers agents %d relays, want 2", len(ranked))
	}
	s := a.m.Status()
	if s.FreshRelays != 2 || s.OnlineDevices != 1 || s.ViewAgeMS < (2*f.base.FreshAfter).Milliseconds() {
		t.Errorf("during the outage a's status: %d fresh relays, %d online devices, view %d ms old; want 2, 1, at least %s",
			s.FreshRelays, s.OnlineDevices, s.ViewAgeMS, 2*f.base.FreshAfter)
	}
	if age := a.m.HeartbeatAge(last.LastSeenAt); age > f.base.FreshAfter {
		t.Errorf("during the outage b's heartbeat is %s old in a's view, want within %s", age, f.base.FreshAfter)
	}

	// b is then really gone: the veto alone moves the device's requests.
	isB := func(id string) bool { return id == b.m.ID() }
	if tg, ok := a.m.Route("dev-b", "eu", isB, ""); !ok || tg.ID != a.m.ID() {
		t.Errorf("with b vetoed a routes dev-b to %+v (ok %v), want itself", tg, ok)
	}
	if ranked := a.m.Ranked("dev-b", "eu", isB); len(ranked) != 1 || ranked[0].ID != a.m.ID() {
		t.Errorf("with b vetoed a offers agents %+v, want only itself", ranked)
	}

	// NATS returns on its files: the view is current again. (It also spares
	// the cleanup the stores' drain timeout of a connection that is away.)
	back, err = store.Open(testContext(t), store.Config{DataDir: natsDir, Listen: u.Host})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		if s := a.m.Status(); !s.NATSConnected || s.ViewAgeMS > f.base.FreshAfter.Milliseconds() || s.FreshRelays != 2 {
			return fmt.Errorf("after the outage a's status: %+v", s)
		}
		return nil
	})
}

// TestHousekeepingOnAFrozenView sweeps with the clock two days ahead of what
// the mirror shows, as when a watch stops delivering while writes still
// succeed: a dead relay with a device and one with nothing look silent for
// longer than the lost window and the reap delay by the clock, but not in
// the view, so nothing is detached and nothing reaped.
func TestHousekeepingOnAFrozenView(t *testing.T) {
	f := newTestFleet(t)
	keeper := f.join(func(c *Config) { c.LeaseTTL = time.Hour }) // holds the lease, so that a's own loop never sweeps
	eventually(t, 5*time.Second, func() error {
		if !keeper.m.LeaseHeld() {
			return errors.New("no lease yet")
		}
		return nil
	})
	a, b, c := f.join(), f.join(), f.join()
	b.local.set("dev-b", Presence{Agents: 1, Protocol: "native"})
	b.m.Changed()
	eventually(t, 5*time.Second, func() error {
		if d, err := a.m.Device("dev-b"); err != nil || d.Agents != 1 || len(a.m.Relays()) != 4 {
			return fmt.Errorf("dev-b %+v, %v; %d relays", d, err, len(a.m.Relays()))
		}
		return nil
	})
	b.kill()
	c.kill()

	a.m.hk = housekeeping{fresh: a.m.lastKnownFreshness()}
	a.m.sweep(testContext(t), time.Now().Add(2*f.base.ReapAfter))

	e, err := a.m.devsKV.Get(testContext(t), "dev-b")
	if err != nil {
		t.Fatal(err)
	}
	var d Attachment
	if err := json.Unmarshal(e.Value(), &d); err != nil || d.Agents != 1 || d.RelayID != b.m.ID() {
		t.Errorf("after the sweep dev-b is %+v (%v), want still on b with its agent", d, err)
	}
	if _, err := a.m.relaysKV.Get(testContext(t), c.m.ID()); err != nil {
		t.Errorf("after the sweep c's record: %v, want it kept", err)
	}
}
