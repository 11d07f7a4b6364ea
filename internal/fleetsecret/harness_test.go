package fleetsecret

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// idleLocal is a relay that holds no device.
type idleLocal struct{}

func (idleLocal) Presence() map[string]fleet.Presence { return nil }
func (idleLocal) AgentSessions() int                  { return 0 }
func (idleLocal) Healthy() bool                       { return true }
func (idleLocal) Stopping() bool                      { return false }

// node is one relay of a test fleet: its member and its keeper, wired as
// a relay wires them.
type node struct {
	m *fleet.Member
	k *Keeper
}

// testFleet is several relays sharing one NATS.
type testFleet struct {
	t    *testing.T
	urls []string
	n    int
}

// newTestFleet starts an embedded NATS server on loopback for the relays
// to share.
func newTestFleet(t *testing.T) *testFleet {
	t.Helper()
	st, err := store.Open(testContext(t), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &testFleet{t: t, urls: []string{st.ClientURL()}}
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fastFleet is the member configuration of a test relay: fast beats.
func fastFleet() fleet.Config {
	return fleet.Config{
		BeatInterval: 100 * time.Millisecond,
		FreshAfter:   600 * time.Millisecond,
		LeaseTTL:     600 * time.Millisecond,
		LostWindow:   time.Hour,
		ReapAfter:    24 * time.Hour,
	}
}

// join starts a relay with its own store connection; adjust may change its
// keeper's configuration.
func (f *testFleet) join(adjust ...func(*Config)) *node {
	t := f.t
	t.Helper()
	n, err := f.open(adjust...)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *testFleet) open(adjust ...func(*Config)) (*node, error) {
	t := f.t
	t.Helper()
	st, err := store.Open(testContext(t), store.Config{URLs: f.urls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f.n++
	id := fmt.Sprintf("rl-%08x", 0xa0000000+f.n)
	fc := fastFleet()
	cfg := Config{RelayID: id, Interval: fc.BeatInterval}
	for _, a := range adjust {
		a(&cfg)
	}
	k, err := Open(testContext(t), st, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { k.Close() })
	fc.RelayID, fc.Hostname, fc.Region, fc.Version = id, "host-"+id, "eu", "v1"
	fc.Addresses = []string{"http://" + id + ".test:8080"}
	fc.Local, fc.Secret, fc.Logger = idleLocal{}, k, cfg.Logger
	m, err := fleet.Open(testContext(t), st, fc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	k.Start(m)
	return &node{m: m, k: k}, nil
}

// eventually polls check until it returns nil or the deadline passes.
var eventually = testkit.Eventually

// waitEvent waits until the event log has an event matching match.
func waitEvent(t *testing.T, m *fleet.Member, within time.Duration, match func(fleet.Event) bool) fleet.Event {
	t.Helper()
	var found fleet.Event
	eventually(t, within, func() error {
		evs, err := m.Events(t.Context(), fleet.MaxEventsList)
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
