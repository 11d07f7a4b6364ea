package fleettest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// getJSON GETs url with a bearer token and decodes a 200 answer into v.
func getJSON(c *http.Client, url, token string, v any) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.Unmarshal(body, v)
}

// TestFleetDirectoryAcrossRelays runs three relays on one NATS: a device's
// agents attach to one of them, and every relay's operator API shows where,
// with the protocol and agent count, and the device's state when they go.
func TestFleetDirectoryAcrossRelays(t *testing.T) {
	relays := StartFleet(t, 3)
	c := NewClient(t, true)
	backend := newBackend(t, "b")
	holder, _ := HolderFor(t, relays, "robot-1")
	agentTok := holder.Token(t, auth.KindAgent, "", "robot-*")

	for _, r := range relays {
		Eventually(t, 10*time.Second, func() error {
			var rs []control.Relay
			if _, err := getJSON(c, r.AdminURL+"/api/v1/relays", r.AdminToken, &rs); err != nil {
				return err
			}
			if len(rs) != 3 {
				return fmt.Errorf("%d relays", len(rs))
			}
			return nil
		})
	}

	native := StartAgent(t, holder, "robot-1", backend.URL, agentTok)
	StartAgent(t, holder, "robot-1", backend.URL, agentTok, func(c *agent.Config) { c.Protocol = agent.ProtocolLongPoll })
	want := holder.Node.Fleet().ID()
	for _, r := range relays {
		Eventually(t, 10*time.Second, func() error {
			var d control.DeviceLink
			if _, err := getJSON(c, r.AdminURL+"/api/v1/devices/robot-1", r.AdminToken, &d); err != nil {
				return err
			}
			if d.RelayID != want || d.Agents != 2 || d.Protocol != "native+longpoll" || d.State != fleet.StateOnline {
				return fmt.Errorf("robot-1 = %+v", d)
			}
			if d.Relay == nil || d.Relay.ID != want || d.Relay.AttachedDevices != 1 || d.Relay.ForwardSessions != 1 || d.Relay.AgentSessions != 2 {
				return fmt.Errorf("robot-1's relay = %+v", d.Relay)
			}
			return nil
		})
	}

	// The native agent leaves: one agent, long-poll, still online.
	native.Stop()
	Eventually(t, 10*time.Second, func() error {
		var d control.DeviceLink
		if _, err := getJSON(c, relays[2].AdminURL+"/api/v1/devices/robot-1", relays[2].AdminToken, &d); err != nil {
			return err
		}
		if d.Agents != 1 || d.Protocol != "longpoll" {
			return fmt.Errorf("robot-1 = %+v", d.Device)
		}
		return nil
	})
}

// TestDeviceVisibility checks who sees what: an admin sees the relay behind
// a device; a user sees only the devices its token allows, by name, state
// and freshness; an agent token sees nothing.
func TestDeviceVisibility(t *testing.T) {
	relays := StartFleet(t, 2)
	r := relays[0]
	c := NewClient(t, true)
	backend := newBackend(t, "b")
	// Where each device lands also depends on the other's load (placement
	// bounds it, so neither relay is asserted): the relay an agent dials
	// may send it on to the other, so every relay must know its token.
	robotHolder, _ := HolderFor(t, relays, "robot-1")
	labHolder, _ := HolderFor(t, relays, "lab-1")
	StartAgent(t, robotHolder, "robot-1", backend.URL, FleetToken(t, relays, auth.KindAgent, "", "robot-1"))
	StartAgent(t, labHolder, "lab-1", backend.URL, FleetToken(t, relays, auth.KindAgent, "", "lab-1"))
	Eventually(t, 10*time.Second, func() error {
		var ds []control.Device
		if _, err := getJSON(c, r.AdminURL+"/api/v1/devices", r.AdminToken, &ds); err != nil {
			return err
		}
		if len(ds) != 2 || ds[0].Name != "lab-1" || ds[1].Name != "robot-1" || ds[1].RelayID == "" {
			return fmt.Errorf("devices %+v", ds)
		}
		return nil
	})

	user := r.Token(t, auth.KindUser, "ann", "robot-*")
	var raw []map[string]any
	if code, err := getJSON(c, r.AdminURL+"/api/v1/devices", user, &raw); code != http.StatusOK || err != nil {
		t.Fatalf("user list: %d, %v", code, err)
	}
	if len(raw) != 1 || raw[0]["name"] != "robot-1" || raw[0]["state"] != fleet.StateOnline || raw[0]["fresh"] != true {
		t.Fatalf("user sees %v", raw)
	}
	keys := []string{}
	for k := range raw[0] {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"fresh", "name", "state"}) {
		t.Errorf("a user sees the fields %v; want only name, state, fresh", keys)
	}

	var one map[string]any
	if code, err := getJSON(c, r.AdminURL+"/api/v1/devices/robot-1", user, &one); code != http.StatusOK || err != nil || len(one) != 3 {
		t.Errorf("user show robot-1: %d, %v, %v", code, err, one)
	}
	// Another's device answers exactly like one that does not exist.
	for _, name := range []string{"lab-1", "nobody"} {
		if code, _ := getJSON(c, r.AdminURL+"/api/v1/devices/"+name, user, &one); code != http.StatusNotFound {
			t.Errorf("user show %s: %d, want 404", name, code)
		}
	}
	// The admin sees the relay behind it.
	var link control.DeviceLink
	if _, err := getJSON(c, r.AdminURL+"/api/v1/devices/lab-1", r.AdminToken, &link); err != nil || link.Relay == nil || link.Relay.ID != link.RelayID || link.Relay.Hostname == "" || len(link.Relay.Addresses) == 0 {
		t.Errorf("admin show lab-1: %+v, %v", link, err)
	}
	// Users may not list relays, events or status; agents may not list devices.
	for _, path := range []string{"/api/v1/relays", "/api/v1/events", "/api/v1/status"} {
		if code, _ := getJSON(c, r.AdminURL+path, user, new(any)); code != http.StatusForbidden {
			t.Errorf("user GET %s: %d, want 403", path, code)
		}
	}
	agentTok := r.Token(t, auth.KindAgent, "", "robot-1")
	if code, _ := getJSON(c, r.AdminURL+"/api/v1/devices", agentTok, new(any)); code != http.StatusForbidden {
		t.Errorf("agent GET devices: %d, want 403", code)
	}
}

// TestRelayRestartKeepsIdentity restarts a relay on the same data dir: it
// is the same relay, enrolled once.
func TestRelayRestartKeepsIdentity(t *testing.T) {
	relays := StartFleet(t, 2)
	dir := t.TempDir()
	nats := func(c *node.Config) { c.NATS = relays[0].Node.Config().NATS; c.DataDir = dir }
	third := StartRelay(t, FastFleet, nats)
	id := third.Node.Fleet().ID()
	third.Node.Close()
	again := StartRelay(t, FastFleet, nats)
	if again.Node.Fleet().ID() != id {
		t.Fatalf("restarted relay has id %s, want %s", again.Node.Fleet().ID(), id)
	}
	Eventually(t, 10*time.Second, func() error {
		rs := relays[0].Node.Fleet().Relays()
		if len(rs) != 3 {
			return fmt.Errorf("%d relays", len(rs))
		}
		evs, err := relays[0].Node.Fleet().Events(t.Context(), 100)
		if err != nil {
			return err
		}
		n := 0
		for _, e := range evs {
			if e.Type == fleet.EventRelayEnrolled && e.RelayID == id {
				n++
			}
		}
		if n != 1 {
			return errors.New("want exactly one enrolment event")
		}
		return nil
	})
}

// TestRelayDeathAcrossTheFleet stops one of three relays: the others see it
// go stale (still listed), and if it ran housekeeping another relay takes
// the lease within the lease length plus a third.
func TestRelayDeathAcrossTheFleet(t *testing.T) {
	relays := StartFleet(t, 3)
	holder := func() []*Relay {
		var out []*Relay
		for _, r := range relays {
			if r.Node.Fleet().LeaseHeld() {
				out = append(out, r)
			}
		}
		return out
	}
	Eventually(t, 10*time.Second, func() error {
		if h := holder(); len(h) != 1 {
			return fmt.Errorf("%d lease holders", len(h))
		}
		return nil
	})
	// Stop the holder the hard way: no goodbye, the lease is not released.
	dead := holder()[0]
	deadID := dead.Node.Fleet().ID()
	dead.Node.Fleet().Abandon()
	dead.Node.Close()
	relays = slices.DeleteFunc(relays, func(r *Relay) bool { return r == dead })
	Eventually(t, 10*time.Second, func() error {
		if h := holder(); len(h) != 1 {
			return fmt.Errorf("%d lease holders", len(h))
		}
		for _, r := range relays {
			rs, err := relayOf(r.Node.Fleet(), deadID)
			if err != nil {
				return err
			}
			if rs.Fresh {
				return errors.New("the stopped relay is still fresh")
			}
		}
		return nil
	})
	// The new holder reports it.
	Eventually(t, 10*time.Second, func() error {
		evs, err := relays[0].Node.Fleet().Events(t.Context(), 100)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Type == fleet.EventRelayStale && e.RelayID == deadID {
				return nil
			}
		}
		return errors.New("no relay.stale event")
	})
}

func relayOf(m *fleet.Member, id string) (fleet.RelayStatus, error) {
	for _, r := range m.Relays() {
		if r.ID == id {
			return r, nil
		}
	}
	return fleet.RelayStatus{}, fmt.Errorf("relay %s not listed", id)
}

// TestCancelDeviceFleetWide drops a device's sessions from another relay:
// the agent's tunnel on its relay is cut within a second, and the agent
// reconnects on its own.
func TestCancelDeviceFleetWide(t *testing.T) {
	relays := StartFleet(t, 3)
	backend := newBackend(t, "b")
	holder, _ := HolderFor(t, relays, "robot-1")
	StartAgent(t, holder, "robot-1", backend.URL, holder.Token(t, auth.KindAgent, "", "robot-1"))
	holder.WaitDevice(t, "robot-1")
	before := holder.Node.TunnelConnects()

	start := time.Now()
	if err := relays[0].Node.Fleet().CancelDevice(t.Context(), "robot-1", "test"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 5*time.Second, func() error {
		if holder.Node.TunnelSessions() != 1 || holder.Node.TunnelConnects() == before {
			return fmt.Errorf("%d tunnels, %d connects (before %d)", holder.Node.TunnelSessions(), holder.Node.TunnelConnects(), before)
		}
		return nil
	})
	t.Logf("the agent was cut and back within %s", time.Since(start))
	Eventually(t, 5*time.Second, func() error {
		evs, err := relays[1].Node.Fleet().Events(t.Context(), 100)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Type == fleet.EventDeviceCancelled && e.Device == "robot-1" {
				return nil
			}
		}
		return errors.New("no device.cancelled event")
	})
}
