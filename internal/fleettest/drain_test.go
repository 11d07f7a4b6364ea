package fleettest

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// TestOperatorDrainMovesOnlyItsDevices drains one relay of three under a
// steady load of requests through every relay: its devices move to the
// others, every other device stays where it is, and no request fails.
func TestOperatorDrainMovesOnlyItsDevices(t *testing.T) {
	relays, devices, user, before := movingFleet(t, 12, 4)
	// Drain the relay that holds dev-0.
	drained := before["dev-0"]

	load := startLoad(t, 4, user, devices, func(i int) *Relay { return relays[i%len(relays)] })
	if err := relays[1].Node.Fleet().SetRelayDraining(t.Context(), drained, true); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 20*time.Second, func() error {
		for _, d := range devices {
			e, err := relays[0].Node.Fleet().Device(d)
			if err != nil {
				return err
			}
			if before[d] == drained && (e.RelayID == drained || e.Agents == 0) {
				return fmt.Errorf("%s still on the drained relay", d)
			}
		}
		return nil
	})
	load.check(t)
	for _, d := range devices {
		e, _ := relays[0].Node.Fleet().Device(d)
		if before[d] != drained && e.RelayID != before[d] {
			t.Errorf("%s moved from %s to %s, but only the drained relay's devices may move", d, before[d], e.RelayID)
		}
	}
}

// TestShutdownMovesDevicesWithoutFailures stops one relay of three as on
// SIGTERM, under load through the relays that are ready: its devices move to
// the others, no request fails, and the relay stops well before its
// deadline.
func TestShutdownMovesDevicesWithoutFailures(t *testing.T) {
	relays, devices, user, before := movingFleet(t, 9, 3)
	victim := relays[0]
	for _, r := range relays {
		if r.Node.Fleet().ID() == before["dev-0"] {
			victim = r
		}
	}

	load := startLoad(t, 3, user, devices, func(i int) *Relay {
		if r := relays[i%len(relays)]; r.Node.Ready() {
			return r
		}
		return nil // the balancer's health check took it out
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err := victim.Node.Shutdown(ctx)
	took := time.Since(start)
	Eventually(t, 10*time.Second, func() error {
		for _, d := range devices {
			e, err := relays[0].Node.Fleet().Device(d)
			if err != nil || e.RelayID == victim.Node.Fleet().ID() || e.Agents == 0 {
				return fmt.Errorf("%s not moved yet", d)
			}
		}
		return nil
	})
	load.check(t)
	if err != nil {
		t.Errorf("Shutdown = %v after %s, want nil before the deadline", err, took)
	}
	t.Logf("stopped in %s", took)
}

// movingFleet starts three relays (a short drain spread) and n devices, each
// with an agent on its holder that knows every relay: every longEvery-th a
// long-poll agent, the others native. It returns the relays, the devices, a
// user token for them, and the relay each device is attached to.
func movingFleet(t *testing.T, n, longEvery int) ([]*Relay, []string, string, map[string]string) {
	t.Helper()
	relays := StartFleet(t, 3, func(c *node.Config) { c.DrainSpread = 300 * time.Millisecond })
	b := newBackend(t, "b")
	tok := FleetToken(t, relays, auth.KindAgent, "", "dev-*")
	user := FleetToken(t, relays, auth.KindUser, "u", "dev-*")
	var devices []string
	for i := range n {
		d := fmt.Sprintf("dev-%d", i)
		devices = append(devices, d)
		h, _ := HolderFor(t, relays, d)
		proto := agent.ProtocolNative
		if i%longEvery == longEvery-1 {
			proto = agent.ProtocolLongPoll
		}
		StartAgent(t, h, d, b.URL, tok, protocol(proto), knowsAll(t, relays))
	}
	before := map[string]string{}
	Eventually(t, 10*time.Second, func() error {
		for _, d := range devices {
			e, err := relays[0].Node.Fleet().Device(d)
			if err != nil || e.Agents == 0 {
				return fmt.Errorf("%s not attached yet", d)
			}
			before[d] = e.RelayID
		}
		return nil
	})
	return relays, devices, user, before
}

// TestDrainedRelayIsNotReady: an operator's drain turns the relay's
// /readyz to 503 at once on both listeners, so that a balancer following it (HAProxy's
// check, a Kubernetes Service) sends it no new agents or users while its
// agents move; an undrain turns it back.
func TestDrainedRelayIsNotReady(t *testing.T) {
	relays := StartFleet(t, 2)
	c := NewClient(t, false)
	readyz := func(r *Relay) (int, error) {
		admin, err := Status(c, r.AdminURL+"/readyz")
		if err != nil {
			return 0, err
		}
		public, err := Status(c, r.URL+"/readyz")
		if public != admin {
			return 0, fmt.Errorf("/readyz: %d on the admin listener, %d on the public one (%v)", admin, public, err)
		}
		return admin, err
	}
	if code, err := readyz(relays[0]); code != http.StatusOK {
		t.Fatalf("/readyz before the drain: %d %v", code, err)
	}
	id := relays[0].Node.Fleet().ID()
	for _, draining := range []bool{true, false} {
		if err := relays[1].Node.Fleet().SetRelayDraining(t.Context(), id, draining); err != nil {
			t.Fatal(err)
		}
		want := map[bool]int{true: http.StatusServiceUnavailable, false: http.StatusOK}[draining]
		Eventually(t, 5*time.Second, func() error {
			if code, err := readyz(relays[0]); code != want {
				return fmt.Errorf("/readyz with draining %v: %d %v, want %d", draining, code, err, want)
			}
			return nil
		})
	}
	if code, err := readyz(relays[1]); code != http.StatusOK {
		t.Errorf("/readyz of the relay that was not drained: %d %v", code, err)
	}
}
