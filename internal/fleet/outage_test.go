package fleet

import (
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
