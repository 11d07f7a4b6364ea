package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeLocal is a relay's own state, set by the test.
type fakeLocal struct {
	mu       sync.Mutex
	presence map[string]Presence
	stopping bool
}

func (l *fakeLocal) Presence() map[string]Presence {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.presence)
}
func (l *fakeLocal) AgentSessions() int { return 0 }
func (l *fakeLocal) Healthy() bool      { return true }
func (l *fakeLocal) Stopping() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopping
}

func (l *fakeLocal) set(device string, p Presence) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.presence == nil {
		l.presence = map[string]Presence{}
	}
	if p.Agents == 0 {
		delete(l.presence, device)
	} else {
		l.presence[device] = p
	}
}

// node is one member of a test fleet.
type node struct {
	m     *Member
	local *fakeLocal
	dir   string
}

// testFleet is several members sharing one NATS.
type testFleet struct {
	t    *testing.T
	urls []string // NATS client URL(s) the members use
	base Config   // timings for every member
}

func fastConfig() Config {
	return Config{
		BeatInterval: 100 * time.Millisecond,
		FreshAfter:   600 * time.Millisecond,
		LeaseTTL:     600 * time.Millisecond,
		LostWindow:   time.Hour,
		ReapAfter:    24 * time.Hour,
	}
}

// newTestFleet starts an embedded NATS server that listens on loopback, for
// members to share; the first store is the server's own.
func newTestFleet(t *testing.T) *testFleet {
	t.Helper()
	st, err := store.Open(testContext(t), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &testFleet{t: t, urls: []string{st.ClientURL()}, base: fastConfig()}
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// join starts a member with its own store connection and data dir.
func (f *testFleet) join(adjust ...func(*Config)) *node {
	t := f.t
	t.Helper()
	st, err := store.Open(testContext(t), store.Config{URLs: f.urls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	dir := t.TempDir()
	id, created, err := LoadOrCreateRelayID(dir)
	if err != nil || !created {
		t.Fatalf("LoadOrCreateRelayID = %q, %v, %v", id, created, err)
	}
	n := &node{local: &fakeLocal{}, dir: dir}
	cfg := f.base
	cfg.RelayID, cfg.Hostname, cfg.Region, cfg.Version = id, "host-"+id, "eu", "v1"
	cfg.Addresses = []string{"http://" + id + ".test:8080"}
	cfg.Local = n.local
	for _, a := range adjust {
		a(&cfg)
	}
	m, err := Open(testContext(t), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	n.m = m
	return n
}

// kill stops a member the way a crash does: its loops end, and it neither
// releases its lease nor says goodbye.
func (n *node) kill() { n.m.Abandon() }

// eventually polls check until it returns nil or the deadline passes.
var eventually = testkit.Eventually

func relayOf(m *Member, id string) (RelayStatus, error) {
	for _, r := range m.Relays() {
		if r.ID == id {
			return r, nil
		}
	}
	return RelayStatus{}, fmt.Errorf("relay %s not in %d relays", id, len(m.Relays()))
}

// waitEvent waits until the event log has an event matching match.
func waitEvent(t *testing.T, m *Member, within time.Duration, match func(Event) bool) Event {
	t.Helper()
	var found Event
	eventually(t, within, func() error {
		evs, err := m.Events(t.Context(), MaxEventsList)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if match(e) {
				found = e
				return nil
			}
		}
		return fmt.Errorf("no matching event among %d", len(evs))
	})
	return found
}

func TestEnrolAndBeat(t *testing.T) {
	f := newTestFleet(t)
	a, b, c := f.join(), f.join(), f.join()

	// Every member sees all three, fresh, with what each reported.
	for _, n := range []*node{a, b, c} {
		eventually(t, 5*time.Second, func() error {
			rs := n.m.Relays()
			if len(rs) != 3 {
				return fmt.Errorf("%d relays", len(rs))
			}
			for _, r := range rs {
				if !r.Fresh || !r.Healthy || r.Draining || r.Version != "v1" || r.Region != "eu" || r.MaxForward != DefaultMaxForward {
					return fmt.Errorf("relay %+v", r)
				}
			}
			return nil
		})
	}
	r, _ := relayOf(a.m, b.m.ID())
	if r.Hostname != "host-"+b.m.ID() || !slices.Equal(r.Addresses, []string{"http://" + b.m.ID() + ".test:8080"}) {
		t.Errorf("relay b = %+v", r)
	}
	// Beats move last_seen_at forward; enrolled_at stays.
	eventually(t, 5*time.Second, func() error {
		now, _ := relayOf(a.m, b.m.ID())
		if !now.LastSeenAt.After(r.LastSeenAt) || !now.EnrolledAt.Equal(r.EnrolledAt) {
			return fmt.Errorf("before %+v, now %+v", r, now)
		}
		return nil
	})
	for _, n := range []*node{a, b, c} {
		id := n.m.ID()
		waitEvent(t, a.m, 5*time.Second, func(e Event) bool { return e.Type == EventRelayEnrolled && e.RelayID == id })
	}

	// The id is kept in the data dir: the same relay on restart.
	id, created, err := LoadOrCreateRelayID(b.dir)
	if err != nil || created || id != b.m.ID() {
		t.Errorf("reloaded id = %q, created %v, %v; want %q", id, created, err, b.m.ID())
	}
}

func TestRelayIDFileRejectsGarbage(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, RelayIDFile), []byte("not-an-id\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateRelayID(dir); err == nil {
		t.Fatal("a garbage relay id was accepted")
	}
}

func TestStaleRelayStaysListed(t *testing.T) {
	f := newTestFleet(t)
	a, b := f.join(), f.join()
	eventually(t, 5*time.Second, func() error {
		r, err := relayOf(a.m, b.m.ID())
		if err == nil && !r.Fresh {
			err = errors.New("b not fresh yet")
		}
		return err
	})
	b.kill()
	eventually(t, 5*time.Second, func() error {
		r, err := relayOf(a.m, b.m.ID())
		if err == nil && r.Fresh {
			err = errors.New("b still fresh")
		}
		return err
	})
	// The housekeeper (a, the only live member) says so in the event log.
	waitEvent(t, a.m, 5*time.Second, func(e Event) bool { return e.Type == EventRelayStale && e.RelayID == b.m.ID() })
}

func TestDrainIsStickyAgainstBeats(t *testing.T) {
	f := newTestFleet(t)
	var mu sync.Mutex
	var told []bool
	a := f.join(func(c *Config) {
		c.OnShouldDrain = func(d bool) {
			mu.Lock()
			told = append(told, d)
			mu.Unlock()
		}
	})
	b := f.join()
	ctx := testContext(t)

	if err := b.m.SetRelayDraining(ctx, a.m.ID(), true); err != nil {
		t.Fatal(err)
	}
	// a learns it from its next beat's answer ...
	eventually(t, 5*time.Second, func() error {
		if !a.m.ShouldDrain() {
			return errors.New("a not told to drain")
		}
		return nil
	})
	// ... and its beats, which report draining=false, never clear it.
	before, _ := relayOf(b.m, a.m.ID())
	eventually(t, 5*time.Second, func() error {
		r, _ := relayOf(b.m, a.m.ID())
		if r.LastSeenAt.Sub(before.LastSeenAt) < 3*f.base.BeatInterval {
			return errors.New("waiting for more beats")
		}
		if !r.Draining {
			t.Fatal("a heartbeat cleared an operator's drain")
		}
		return nil
	})
	waitEvent(t, b.m, 5*time.Second, func(e Event) bool { return e.Type == EventRelayDraining && e.RelayID == a.m.ID() })

	// Only the operator call undrains.
	if err := b.m.SetRelayDraining(ctx, a.m.ID(), false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		r, _ := relayOf(b.m, a.m.ID())
		if r.Draining || a.m.ShouldDrain() {
			return errors.New("still draining")
		}
		return nil
	})
	mu.Lock()
	if !slices.Equal(told, []bool{true, false}) {
		t.Errorf("OnShouldDrain calls = %v, want [true false]", told)
	}
	mu.Unlock()

	// A relay may volunteer: stored = stored OR reported. The answer says so,
	// and the next beat without it does not clear it.
	ans, err := beat(ctx, a.m.relaysKV, a.m.ID(), Report{Healthy: true, Draining: true}, time.Second)
	if err != nil || !ans.ShouldDrain {
		t.Fatalf("volunteering beat = %+v, %v", ans, err)
	}
	ans, err = beat(ctx, a.m.relaysKV, a.m.ID(), Report{Healthy: true}, time.Second)
	if err != nil || !ans.ShouldDrain {
		t.Fatalf("beat after volunteering = %+v, %v; the drain must stick", ans, err)
	}

	if err := b.m.SetRelayDraining(ctx, "rl-00000000", true); !errors.Is(err, ErrNotFound) {
		t.Errorf("draining an unknown relay: %v, want ErrNotFound", err)
	}
}

func TestStoppingIsNotSticky(t *testing.T) {
	f := newTestFleet(t)
	a, b := f.join(), f.join()
	a.local.mu.Lock()
	a.local.stopping = true
	a.local.mu.Unlock()
	eventually(t, 5*time.Second, func() error {
		if r, _ := relayOf(b.m, a.m.ID()); !r.Stopping || r.Draining {
			return fmt.Errorf("relay a = %+v", r)
		}
		return nil
	})
	waitEvent(t, b.m, 5*time.Second, func(e Event) bool { return e.Type == EventRelayStopping && e.RelayID == a.m.ID() })
	a.local.mu.Lock()
	a.local.stopping = false
	a.local.mu.Unlock()
	eventually(t, 5*time.Second, func() error {
		if r, _ := relayOf(b.m, a.m.ID()); r.Stopping {
			return fmt.Errorf("relay a = %+v", r)
		}
		return nil
	})
}

func TestLeaseTakeoverWhenHolderDies(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	f.base.LeaseTTL = 3 * time.Second // the default: takeover within 4 s
	nodes := []*node{f.join(), f.join(), f.join()}
	holders := func() []*node {
		var out []*node
		for _, n := range nodes {
			if n.m.LeaseHeld() {
				out = append(out, n)
			}
		}
		return out
	}
	eventually(t, 5*time.Second, func() error {
		if h := holders(); len(h) != 1 {
			return fmt.Errorf("%d holders", len(h))
		}
		return nil
	})
	old := holders()[0]
	old.kill()
	died := time.Now()
	eventually(t, 6*time.Second, func() error {
		if h := holders(); len(h) != 1 {
			return fmt.Errorf("%d holders", len(h))
		}
		return nil
	})
	if took := time.Since(died); took > 4*time.Second+500*time.Millisecond {
		t.Errorf("takeover took %s, want ≤ 4 s", took)
	}
	if holders()[0] == old {
		t.Fatal("the dead node still holds the lease")
	}
}

func TestLeaseHandedOverOnClose(t *testing.T) {
	f := newTestFleet(t)
	f.base.LeaseTTL = time.Minute // only a release can hand it over in time
	a := f.join()
	eventually(t, 5*time.Second, func() error {
		if !a.m.LeaseHeld() {
			return errors.New("a has no lease")
		}
		return nil
	})
	b := f.join(func(c *Config) { c.LeaseTTL = 300 * time.Millisecond })
	a.m.Close()
	eventually(t, 5*time.Second, func() error {
		if !b.m.LeaseHeld() {
			return errors.New("b has no lease")
		}
		return nil
	})
}

func TestDirectory(t *testing.T) {
	f := newTestFleet(t)
	a, b, c := f.join(), f.join(), f.join()
	find := func(m *Member, name string) (DeviceLink, error) { return m.Device(name) }

	a.local.set("robot-1", Presence{Agents: 1, Protocol: "native"})
	a.m.Changed()
	var first DeviceLink
	for _, n := range []*node{a, b, c} {
		eventually(t, 5*time.Second, func() error {
			d, err := find(n.m, "robot-1")
			if err == nil && (d.RelayID != a.m.ID() || d.Agents != 1 || d.State != StateOnline || !d.Fresh || d.Relay == nil || d.Relay.ID != a.m.ID()) {
				err = fmt.Errorf("entry %+v", d)
			}
			first = d
			return err
		})
	}
	waitEvent(t, c.m, 5*time.Second, func(e Event) bool { return e.Type == EventDeviceAttached && e.Device == "robot-1" })

	// A second agent on the same relay: the count changes, attached_at stays.
	a.local.set("robot-1", Presence{Agents: 2, Protocol: "native+longpoll"})
	a.m.Changed()
	eventually(t, 5*time.Second, func() error {
		d, err := find(b.m, "robot-1")
		if err == nil && (d.Agents != 2 || d.Protocol != "native+longpoll") {
			err = fmt.Errorf("entry %+v", d)
		}
		if err == nil && !d.AttachedAt.Equal(first.AttachedAt) {
			t.Fatalf("attached_at changed without a move: %s → %s", first.AttachedAt, d.AttachedAt)
		}
		return err
	})

	// The device moves to b: attached_at changes, and a move is recorded.
	a.local.set("robot-1", Presence{})
	b.local.set("robot-1", Presence{Agents: 1, Protocol: "longpoll"})
	b.m.Changed()
	eventually(t, 5*time.Second, func() error {
		d, err := find(c.m, "robot-1")
		if err == nil && (d.RelayID != b.m.ID() || !d.AttachedAt.After(first.AttachedAt)) {
			err = fmt.Errorf("entry %+v", d)
		}
		return err
	})
	moved := waitEvent(t, c.m, 5*time.Second, func(e Event) bool { return e.Type == EventDeviceMoved && e.Device == "robot-1" })
	if moved.From != a.m.ID() || moved.RelayID != b.m.ID() {
		t.Errorf("move event %+v", moved)
	}
	// a's later detach is not honoured: the device is recorded on b now.
	a.m.Changed()
	if done, err := detach(testContext(t), a.m.devsKV, a.m.ID(), "robot-1", nil); err != nil || done {
		t.Errorf("detach by the old relay = %v, %v; want ignored", done, err)
	}

	// b's last agent leaves: agents 0, relay remembered.
	b.local.set("robot-1", Presence{})
	b.m.Changed()
	eventually(t, 5*time.Second, func() error {
		d, err := find(a.m, "robot-1")
		if err == nil && (d.Agents != 0 || d.RelayID != b.m.ID() || d.State != StateOffline || d.Fresh) {
			err = fmt.Errorf("entry %+v", d)
		}
		return err
	})
	if n := len(c.m.Devices()); n != 1 {
		t.Errorf("%d devices listed, want 1", n)
	}
	if _, err := c.m.Device("nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown device: %v", err)
	}
}

func TestDeviceKeys(t *testing.T) {
	for _, name := range []string{"robot-1", "a.b", "x_y"} {
		if k := deviceKey(name); k != name {
			t.Errorf("deviceKey(%q) = %q, want the name", name, k)
		}
	}
	seen := map[string]bool{}
	for _, name := range []string{"trailing.", "two..dots", "robot-1", "=odd", ".lead"} {
		k := deviceKey(name)
		if seen[k] {
			t.Errorf("key %q collides", k)
		}
		seen[k] = true
	}
	// Names that are no valid key still round-trip through the directory.
	f := newTestFleet(t)
	a := f.join()
	a.local.set("odd.", Presence{Agents: 1, Protocol: "native"})
	a.m.Changed()
	eventually(t, 5*time.Second, func() error {
		_, err := a.m.Device("odd.")
		return err
	})
}

func TestHousekeepingDetachesLostAndReaps(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	f.base.LostWindow = time.Second
	f.base.ReapAfter = 2 * time.Second
	a, b := f.join(), f.join()
	b.local.set("lab-7", Presence{Agents: 1, Protocol: "native"})
	b.m.Changed()
	eventually(t, 5*time.Second, func() error {
		d, err := a.m.Device("lab-7")
		if err == nil && d.Agents != 1 {
			err = fmt.Errorf("entry %+v", d)
		}
		return err
	})
	bID := b.m.ID()
	b.kill()

	// Past the lost window, the housekeeper detaches b's devices ...
	waitEvent(t, a.m, 10*time.Second, func(e Event) bool { return e.Type == EventRelayLost && e.RelayID == bID })
	// The event follows the write; the mirror follows the write's echo.
	eventually(t, 5*time.Second, func() error {
		d, err := a.m.Device("lab-7")
		if err == nil && (d.Agents != 0 || d.RelayID != bID) {
			err = fmt.Errorf("after the lost window: %+v, want detached but still recorded on %s", d, bID)
		}
		return err
	})
	// ... and past the reap age removes b, which has nothing attached now,
	// and forgets the device, detached as long.
	waitEvent(t, a.m, 10*time.Second, func(e Event) bool { return e.Type == EventRelayReaped && e.RelayID == bID })
	eventually(t, 5*time.Second, func() error {
		if _, err := relayOf(a.m, bID); err == nil {
			return errors.New("b still listed")
		}
		if _, err := a.m.Device("lab-7"); err == nil {
			return errors.New("lab-7 still listed")
		}
		return nil
	})
	// The live relay is never reaped.
	if _, err := relayOf(a.m, a.m.ID()); err != nil {
		t.Fatal(err)
	}
}

func TestReapSparesRelayWithDevices(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	f.base.LostWindow = time.Hour // devices are never detached here
	f.base.ReapAfter = time.Second
	a, b := f.join(), f.join()
	b.local.set("kept", Presence{Agents: 1, Protocol: "native"})
	b.m.Changed()
	eventually(t, 5*time.Second, func() error { _, err := a.m.Device("kept"); return err })
	bID := b.m.ID()
	b.kill()
	eventually(t, 5*time.Second, func() error {
		if r, _ := relayOf(a.m, bID); r.Fresh {
			return errors.New("still fresh")
		}
		return nil
	})
	// Several sweeps past the reap age: b stays, as a device is attached.
	waitEvent(t, a.m, 5*time.Second, func(e Event) bool { return e.Type == EventRelayStale && e.RelayID == bID })
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := relayOf(a.m, bID); err != nil {
			t.Fatal("a relay with an attached device was reaped")
		}
		<-time.After(50 * time.Millisecond)
	}
}

// TestEventsBurstPublishedInOrder: a burst of events, as a drain's
// thousands of moves make, is published in batches, all of it and in the
// order recorded.
func TestEventsBurstPublishedInOrder(t *testing.T) {
	f := newTestFleet(t)
	a := f.join()
	waitEvent(t, a.m, 5*time.Second, func(e Event) bool { return e.Type == EventLeaseTaken })
	const n = 900 // under the queue's size: none is dropped
	for i := range n {
		a.m.Record(Event{Type: "test.burst", Message: fmt.Sprint(i)})
	}
	eventually(t, 10*time.Second, func() error {
		evs, err := a.m.Events(t.Context(), MaxEventsList)
		if err != nil {
			return err
		}
		var got []string
		for _, e := range evs {
			if e.Type == "test.burst" {
				got = append(got, e.Message)
			}
		}
		if len(got) != n {
			return fmt.Errorf("%d of %d events published", len(got), n)
		}
		for i, m := range got {
			if m != fmt.Sprint(i) {
				return fmt.Errorf("event %d of the burst is %q: out of order", i, m)
			}
		}
		return nil
	})
	if d := a.m.events.dropped.Load(); d != 0 {
		t.Errorf("%d events dropped", d)
	}
}

func TestEventsListBounds(t *testing.T) {
	f := newTestFleet(t)
	a := f.join()
	// Let the member's own events (enrolment, lease) land first.
	waitEvent(t, a.m, 5*time.Second, func(e Event) bool { return e.Type == EventLeaseTaken })
	for i := range 5 {
		a.m.Record(Event{Type: "test.event", Message: fmt.Sprint(i)})
	}
	eventually(t, 5*time.Second, func() error {
		evs, err := a.m.Events(t.Context(), 3)
		if err != nil {
			return err
		}
		if len(evs) != 3 || evs[2].Message != "4" || evs[0].Message != "2" || evs[0].Seq >= evs[2].Seq {
			b, _ := json.Marshal(evs)
			return fmt.Errorf("last 3 = %s", b)
		}
		return nil
	})
}

func TestFollowEvents(t *testing.T) {
	f := newTestFleet(t)
	a, b := f.join(), f.join()
	ctx, cancel := context.WithCancel(testContext(t))
	got := make(chan Event, 16)
	done := make(chan error, 1)
	go func() {
		done <- a.m.FollowEvents(ctx, func(e Event) error {
			if e.Type == "test.follow" {
				got <- e
			}
			return nil
		})
	}()
	// The follower starts at "now": keep recording until one arrives.
	eventually(t, 5*time.Second, func() error {
		b.m.Record(Event{Type: "test.follow", Message: "hello"})
		select {
		case e := <-got:
			if e.By != b.m.ID() || e.Seq == 0 {
				t.Errorf("followed event %+v", e)
			}
			return nil
		case <-time.After(100 * time.Millisecond):
			return errors.New("nothing followed yet")
		}
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("FollowEvents = %v", err)
	}
}

// TestDrainAndVetoAreSeparate: placement leaves out draining relays and
// vetoed ones; a veto that clears leaves the drain in place.
func TestDrainAndVetoAreSeparate(t *testing.T) {
	f := newTestFleet(t)
	a, b, c := f.join(), f.join(), f.join()
	if err := a.m.SetRelayDraining(testContext(t), b.m.ID(), true); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		if r, _ := relayOf(a.m, b.m.ID()); !r.Draining {
			return errors.New("drain not seen yet")
		}
		return nil
	})
	var mu sync.Mutex
	vetoC := true
	vetoed := func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		return vetoC && id == c.m.ID()
	}
	placed := func() map[string]int {
		out := map[string]int{}
		for i := range 200 {
			t, ok := a.m.Holder(fmt.Sprintf("new-%d", i), "", vetoed, "")
			if ok {
				out[t.ID]++
			}
		}
		return out
	}
	if got := placed(); got[a.m.ID()] != 200 {
		t.Fatalf("with b draining and c vetoed, placement = %v, want everything on a", got)
	}
	mu.Lock()
	vetoC = false // a probe answered
	mu.Unlock()
	got := placed()
	if got[b.m.ID()] != 0 || got[c.m.ID()] == 0 {
		t.Fatalf("after the veto cleared, placement = %v: c must take devices again, b (draining) none", got)
	}
	// Users still reach a draining relay that holds their device's agents.
	b.local.set("held", Presence{Agents: 1, Protocol: "native"})
	b.m.Changed()
	eventually(t, 5*time.Second, func() error {
		tg, ok := a.m.Route("held", "", nil, "")
		if !ok || tg.ID != b.m.ID() {
			return fmt.Errorf("route = %+v", tg)
		}
		return nil
	})
	if tg, _ := a.m.Holder("held", "", nil, ""); tg.ID == b.m.ID() {
		t.Error("a draining relay was chosen to place a device's new agent")
	}
}
