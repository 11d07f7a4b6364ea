package fleettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/cli"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// ctl runs 'switchboard ctl' in process against relay r.
func ctl(ctx context.Context, r *Relay, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	full := append([]string{"ctl", "--admin", r.AdminURL, "--token-file", r.Node.AdminTokenPath()}, args...)
	code = cli.Run(ctx, full, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestRollGuards(t *testing.T) {
	ctx := t.Context()
	t.Run("not enabled", func(t *testing.T) {
		relays := StartFleet(t, 2)
		code, _, stderr := ctl(ctx, relays[0], "roll", "--update-cmd", "true")
		if code != cli.ExitFailure || !strings.Contains(stderr, "rolling updates are off for this fleet") {
			t.Fatalf("exit %d, %q", code, stderr)
		}
	})
	t.Run("last relay", func(t *testing.T) {
		relays := StartFleet(t, 1)
		if code, _, stderr := ctl(ctx, relays[0], "roll", "enable"); code != 0 {
			t.Fatal(stderr)
		}
		code, _, stderr := ctl(ctx, relays[0], "roll", "--update-cmd", "true")
		if code != cli.ExitFailure || !strings.Contains(stderr, "is the last relay serving") {
			t.Fatalf("exit %d, %q", code, stderr)
		}
		assertNothingHeld(t, relays)
	})
	t.Run("no sibling can take the load", func(t *testing.T) {
		relays := StartFleet(t, 2, func(c *node.Config) { c.Fleet.MaxForward = 1 })
		b := newBackend(t, "b")
		tok := FleetToken(t, relays, auth.KindAgent, "", "*")
		// One device on each relay fills both.
		for i, r := range relays {
			d := fmt.Sprintf("full-%d", i)
			for j := 0; ; j++ {
				if h, _ := HolderFor(t, relays, d); h == r {
					break
				}
				d = fmt.Sprintf("full-%d-%d", i, j)
			}
			StartAgent(t, r, d, b.URL, tok)
			waitHolder(t, relays, d, r)
		}
		ctl(ctx, relays[0], "roll", "enable")
		code, _, stderr := ctl(ctx, relays[0], "roll", "--update-cmd", "true")
		if code != cli.ExitFailure || !strings.Contains(stderr, "but the other relays have room for 0") {
			t.Fatalf("exit %d, %q", code, stderr)
		}
		assertNothingHeld(t, relays)
	})
}

// assertNothingHeld checks that every relay's view of the fleet shows no
// relay draining once the views have caught up with the store: the release
// is a store write that each relay learns by its watch.
func assertNothingHeld(t *testing.T, relays []*Relay) {
	t.Helper()
	Eventually(t, 5*time.Second, func() error {
		for _, r := range relays {
			for _, rs := range r.Node.Fleet().Relays() {
				if rs.Draining {
					return fmt.Errorf("relay %s was left draining (as %s sees it)", rs.ID, r.Node.Fleet().ID())
				}
			}
		}
		return nil
	})
}

// restarter restarts, as an update step, the relay named by each file that
// the update command creates in dir: a graceful shutdown, then a start on
// the same data dir with version "v2".
type restarter struct {
	t      *testing.T
	dir    string
	mu     sync.Mutex
	relays map[string]*Relay // by relay id: the running ones
	nats   []string
	stop   chan struct{}
	done   chan struct{}
	seen   map[string]bool
}

func newRestarter(t *testing.T, relays []*Relay) *restarter {
	r := &restarter{t: t, dir: t.TempDir(), relays: map[string]*Relay{}, stop: make(chan struct{}), done: make(chan struct{}), seen: map[string]bool{},
		nats: relays[0].Node.Config().NATS}
	for _, x := range relays {
		r.relays[x.Node.Fleet().ID()] = x
	}
	go r.watch()
	t.Cleanup(func() { close(r.stop); <-r.done })
	return r
}

func (r *restarter) watch() {
	defer close(r.done)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		entries, _ := os.ReadDir(r.dir)
		for _, e := range entries {
			id := strings.TrimPrefix(e.Name(), "restart-")
			if r.seen[e.Name()] {
				continue
			}
			r.seen[e.Name()] = true
			r.restart(id)
		}
	}
}

func (r *restarter) restart(id string) {
	r.mu.Lock()
	old := r.relays[id]
	delete(r.relays, id)
	r.mu.Unlock()
	if old == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	began := time.Now()
	if err := old.Node.Shutdown(ctx); err != nil {
		r.t.Logf("relay %s: shutdown after %s: %v", id, time.Since(began), err)
	}
	cancel()
	cfg := old.Node.Config()
	// The same addresses: agents and operators find it where it was.
	fresh := StartRelay(r.t, FastFleet, func(c *node.Config) {
		c.DataDir, c.NATS, c.Version = cfg.DataDir, r.nats, "v2"
		c.Listen, c.AdminListen = old.Node.Addr(), old.Node.AdminAddr()
	})
	r.mu.Lock()
	r.relays[id] = fresh
	r.mu.Unlock()
}

func (r *restarter) up() []*Relay {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*Relay
	for _, x := range r.relays {
		out = append(out, x)
	}
	return out
}

// TestRollUpdatesEveryRelay rolls three relays under load: each is held,
// emptied, restarted with a new version by the update step, and released;
// no request fails and nothing is left held.
func TestRollUpdatesEveryRelay(t *testing.T) {
	relays := StartFleet(t, 3, func(c *node.Config) { c.DrainSpread = 200 * time.Millisecond })
	rs := newRestarter(t, relays)
	b := newBackend(t, "b")
	tok := FleetToken(t, relays, auth.KindAgent, "", "roll-*")
	user := FleetToken(t, relays, auth.KindUser, "u", "roll-*")
	devices := []string{"roll-0", "roll-1", "roll-2", "roll-3", "roll-4", "roll-5"}
	for i, d := range devices {
		h, _ := HolderFor(t, relays, d)
		proto := "native"
		if i%3 == 2 {
			proto = "longpoll"
		}
		// Agents know every relay, as behind a balancer: long-poll
		// agents, which cannot be told where to go, need that.
		StartAgent(t, h, d, b.URL, tok, protocol(proto), knowsAll(t, relays))
	}
	Eventually(t, 10*time.Second, func() error {
		for _, d := range devices {
			if e, err := relays[0].Node.Fleet().Device(d); err != nil || e.Agents == 0 {
				return fmt.Errorf("%s not attached", d)
			}
		}
		return nil
	})
	ctl(t.Context(), relays[0], "roll", "enable")

	// Load through whichever relays are up, as a balancer with health checks.
	load := startLoad(t, 3, user, devices, func(i int) *Relay {
		up := rs.up()
		if r := up[i%len(up)]; r.Node.Ready() {
			return r
		}
		return nil
	})

	// Roll through a relay that stays up: the first in the list may not.
	admin := relays[0]
	code, stdout, stderr := ctl(t.Context(), admin, "roll", "--update-cmd", "touch "+filepath.Join(rs.dir, "restart-")+"{id}",
		"--expect-version", "v2", "--poll", "50ms", "--up-timeout", "30s")
	load.halt()
	t.Logf("roll exit %d, output:\n%s\n%s", code, stdout, stderr)
	if code != 0 {
		t.Fatalf("roll exit %d: %s", code, stderr)
	}
	up := rs.up()
	Eventually(t, 10*time.Second, func() error {
		for _, st := range up[0].Node.Fleet().Relays() {
			if st.Version != "v2" || st.Draining {
				return fmt.Errorf("relay %s: version %s, draining %v", st.ID, st.Version, st.Draining)
			}
		}
		return nil
	})
	if code, out, _ := ctl(t.Context(), up[0], "roll", "status"); code != 0 || !strings.Contains(out, "none in progress") {
		t.Errorf("roll status after the roll: %s", out)
	}
	load.check(t)
}

// TestRollInterruptedReleasesTheHold interrupts a roll while its update step
// runs: the relay is released, the roll stays recorded, and running the roll
// again finishes it.
func TestRollInterruptedReleasesTheHold(t *testing.T) {
	relays := StartFleet(t, 3)
	rs := newRestarter(t, relays)
	ctl(t.Context(), relays[0], "roll", "enable")
	// Pick the relay that is not rolled first as the one we talk to.
	ids := []string{}
	for _, r := range relays {
		ids = append(ids, r.Node.Fleet().ID())
	}
	admin := relays[0]
	for _, r := range relays {
		if r.Node.Fleet().ID() != minString(ids) {
			admin = r
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var out bytes.Buffer
	go func() {
		var errOut bytes.Buffer
		done <- cli.Run(ctx, []string{"ctl", "--admin", admin.AdminURL, "--token-file", admin.Node.AdminTokenPath(),
			"roll", "--update-cmd", "sleep 60", "--poll", "50ms"}, &out, &errOut)
	}()
	Eventually(t, 10*time.Second, func() error {
		code, stdout, _ := ctl(t.Context(), admin, "roll", "status")
		if code != 0 || !strings.Contains(stdout, "(updating)") {
			return errors.New("not updating yet: " + stdout)
		}
		return nil
	})
	cancel() // Ctrl-C
	if code := <-done; code == 0 {
		t.Fatal("an interrupted roll exited 0")
	}
	assertNothingHeld(t, rs.up())
	code, stdout, _ := ctl(t.Context(), admin, "roll", "status")
	if code != 0 || !strings.Contains(stdout, "0 of 3 relays done") {
		t.Fatalf("status after the interrupt: %s", stdout)
	}
	// Again, with a real update step: it resumes and finishes.
	code, stdout, stderr := ctl(t.Context(), admin, "roll", "--update-cmd", "touch "+filepath.Join(rs.dir, "restart-")+"{id}",
		"--poll", "50ms", "--up-timeout", "30s")
	if code != 0 || !strings.Contains(stdout, "resuming the roll") {
		t.Fatalf("resumed roll: exit %d\n%s\n%s", code, stdout, stderr)
	}
	assertNothingHeld(t, rs.up())
}

func minString(s []string) string {
	m := s[0]
	for _, x := range s[1:] {
		m = min(m, x)
	}
	return m
}
