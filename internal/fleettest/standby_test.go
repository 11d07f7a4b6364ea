package fleettest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// standbyFleet starts n relays sharing a NATS server, each advertising the
// address of a freezer in front of it, so that a test can freeze one for
// its peers and agents. each, if set, adjusts relay i's config.
func standbyFleet(t *testing.T, n int, each func(i int, c *node.Config)) ([]*Relay, []*freezer) {
	t.Helper()
	st, err := store.Open(context.Background(), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start the fleet's NATS: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	var relays []*Relay
	var fz []*freezer
	for i := range n {
		f := newFreezer(t)
		r := StartRelay(t, FastFleet, func(c *node.Config) {
			c.NATS = []string{st.ClientURL()}
			c.Advertise = f.URL()
			c.HotStandby = true
			if each != nil {
				each(i, c)
			}
		})
		f.start(r.Node.Addr())
		relays, fz = append(relays, r), append(fz, f)
	}
	return relays, fz
}

// deviceHeldBy returns a device name the fleet places on relay r.
func deviceHeldBy(t *testing.T, relays []*Relay, r *Relay) string {
	t.Helper()
	for i := range 64 {
		name := fmt.Sprintf("robot-%d", i)
		if h, _ := HolderFor(t, relays, name); h == r {
			return name
		}
	}
	t.Fatal("no device name is placed on the relay")
	return ""
}

// standbyOf waits until relay sb keeps a standby tunnel for device and
// the directory, as holder sees it, records holder and standby.
func standbyOf(t *testing.T, holder, sb *Relay, device string) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		if sb.Node.Standbys()[device] != 1 {
			return fmt.Errorf("relay %s keeps %d standbys of %s", sb.Node.Fleet().ID(), sb.Node.Standbys()[device], device)
		}
		e, ok := holder.Node.Fleet().Entry(device)
		if !ok || e.RelayID != holder.Node.Fleet().ID() || e.Standby != sb.Node.Fleet().ID() {
			return fmt.Errorf("the directory records %+v", e)
		}
		return nil
	})
}

// robotWithStandby starts robot-1's agent at the relay of the two that
// holds it and waits until the other keeps its standby; it returns both
// relays, a user token for the device, and the agent's log.
func robotWithStandby(t *testing.T, relays []*Relay) (holder, sb *Relay, user string, logs *testkit.Buffer) {
	t.Helper()
	holder, others := HolderFor(t, relays, "robot-1")
	sb = others[0]
	backend := newBackend(t, "b")
	agentTok := FleetToken(t, relays, auth.KindAgent, "", "robot-*")
	user = FleetToken(t, relays, auth.KindUser, "u", "robot-1")
	logs = &testkit.Buffer{}
	StartAgent(t, holder, "robot-1", backend.URL, agentTok, func(c *agent.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	holder.WaitDevice(t, "robot-1")
	standbyOf(t, holder, sb, "robot-1")
	return holder, sb, user, logs
}

// userGet GETs the device's echo through relay r, with a short timeout.
func userGet(c *http.Client, r *Relay, device, user string) error {
	req, err := http.NewRequest(http.MethodGet, r.URL+"/client/"+device+"/echo/x", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+user)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET through %s: %s", r.Node.Fleet().ID(), resp.Status)
	}
	return nil
}

// TestStandbyTunnelIsKeptWithoutClaiming: an agent keeps a second tunnel
// at the relay its holder names; that relay records itself as the device's
// standby, does not take the device, and forwards its users to the holder.
// The standby and its record go when the agent does.
func TestStandbyTunnelIsKeptWithoutClaiming(t *testing.T) {
	relays, _ := standbyFleet(t, 2, nil)
	holder, others := HolderFor(t, relays, "robot-1")
	sb := others[0]
	backend := newBackend(t, "b")
	agentTok := FleetToken(t, relays, auth.KindAgent, "", "robot-*")
	user := FleetToken(t, relays, auth.KindUser, "u", "robot-1")
	a := StartAgent(t, holder, "robot-1", backend.URL, agentTok)
	holder.WaitDevice(t, "robot-1")
	standbyOf(t, holder, sb, "robot-1")

	if slices.Contains(sb.Node.Devices(), "robot-1") {
		t.Fatal("the standby relay lists the device as its own")
	}
	if got := sb.Node.TunnelSessions(); got != 0 {
		t.Fatalf("the standby relay counts %d tunnels; a standby is none", got)
	}
	c := NewClient(t, true)
	hits := backend.hits.Load()
	if err := userGet(c, sb, "robot-1", user); err != nil {
		t.Fatal(err)
	}
	if backend.hits.Load() != hits+1 {
		t.Fatal("the request did not reach the backend once")
	}
	if e, _ := sb.Node.Fleet().Entry("robot-1"); e.RelayID != holder.Node.Fleet().ID() {
		t.Fatalf("a request through the standby relay moved the device: %+v", e)
	}

	a.Stop()
	Eventually(t, 10*time.Second, func() error {
		if n := sb.Node.Standbys()["robot-1"]; n != 0 {
			return fmt.Errorf("%d standbys left", n)
		}
		if e, _ := holder.Node.Fleet().Entry("robot-1"); e.Standby != "" {
			return fmt.Errorf("the directory still records a standby: %+v", e)
		}
		return nil
	})
}

// TestStandbyRefusedByOlderRelay: a relay from before hot standby refuses
// the standby offer without taking the device, and the agent serves on
// with no standby.
func TestStandbyRefusedByOlderRelay(t *testing.T) {
	relays, _ := standbyFleet(t, 2, func(i int, c *node.Config) { c.HotStandby = i != 1 })
	holder, old := relays[0], relays[1]
	device := deviceHeldBy(t, relays, holder)
	backend := newBackend(t, "b")
	agentTok := FleetToken(t, relays, auth.KindAgent, "", "robot-*")
	user := FleetToken(t, relays, auth.KindUser, "u", device)
	logs := &testkit.Buffer{}
	StartAgent(t, holder, device, backend.URL, agentTok, func(c *agent.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	holder.WaitDevice(t, device)
	Eventually(t, 10*time.Second, func() error {
		if logs.Count("no standby tunnel") == 0 {
			return errors.New("the agent has not given the standby up yet")
		}
		return nil
	})
	if n := len(old.Node.Standbys()); n != 0 || slices.Contains(old.Node.Devices(), device) {
		t.Fatalf("the older relay took the standby (%d) or the device", n)
	}
	Eventually(t, 5*time.Second, func() error {
		if e, _ := holder.Node.Fleet().Entry(device); e.RelayID != holder.Node.Fleet().ID() || e.Standby != "" {
			return fmt.Errorf("the directory records %+v", e)
		}
		return nil
	})
	if err := userGet(NewClient(t, true), old, device, user); err != nil {
		t.Fatal(err)
	}
}

// standingBy starts two relays behind freezers and an agent of robot-1 on
// its holder, through the holder's freezer, pinging slowly (it notices
// nothing by itself), with its standby tunnel at the other relay; opts
// apply to the agent's configuration last. It returns the standby relay,
// the holder's freezer, a user token for robot-1, the agent's logs, and
// how many tunnels the standby relay had taken.
func standingBy(t *testing.T, opts ...func(*agent.Config)) (sb *Relay, holderFz *freezer, user string, logs *testkit.Buffer, connects int64) {
	t.Helper()
	relays, fz := standbyFleet(t, 2, nil)
	holder, others := HolderFor(t, relays, "robot-1")
	sb, holderFz = others[0], fz[slices.Index(relays, holder)]
	backend := newBackend(t, "b")
	agentTok := FleetToken(t, relays, auth.KindAgent, "", "robot-*")
	user = FleetToken(t, relays, auth.KindUser, "u", "robot-1")
	logs = &testkit.Buffer{}
	StartAgent(t, holder, "robot-1", backend.URL, agentTok, func(c *agent.Config) {
		c.Relays = []*url.URL{mustParse(t, holderFz.URL())} // through the freezer
		c.Liveness.Interval, c.Liveness.Timeout = 2*time.Second, 30*time.Second
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		for _, o := range opts {
			o(c)
		}
	})
	holder.WaitDevice(t, "robot-1")
	standbyOf(t, holder, sb, "robot-1")
	return sb, holderFz, user, logs, sb.Node.TunnelConnects()
}

// TestFrozenHolderMovesToStandby freezes the relay holding a device, for
// its peers and its agent alike: the standby relay's watchdog vetoes it,
// promotes the standby tunnel, and users' requests are served through it
// while the agent has not noticed anything itself (its pings wait far
// longer) and never reconnects.
func TestFrozenHolderMovesToStandby(t *testing.T) {
	sb, frozen, user, logs, connects := standingBy(t)
	// The standby relay hears the holder over a pulse, not HTTP probes.
	metricsHave(t, http.DefaultClient, sb.AdminURL, "\nswitchboard_watchdog_pulses 1\n")

	frozen.freeze()
	froze := time.Now()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	Eventually(t, 8*time.Second, func() error { return userGet(c, sb, "robot-1", user) })
	t.Logf("served through the standby %v after the freeze", time.Since(froze).Round(time.Millisecond))

	// The standby serves the promoted tunnel at once; its write of the
	// move reaches the directory (and its own mirror of it) soon after.
	Eventually(t, 5*time.Second, func() error {
		if e, _ := sb.Node.Fleet().Entry("robot-1"); e.RelayID != sb.Node.Fleet().ID() {
			return fmt.Errorf("the directory records %+v, not the standby relay", e)
		}
		return nil
	})
	if got := sb.Node.TunnelConnects(); got != connects+1 {
		t.Fatalf("the standby relay took %d tunnels, want the promoted one alone", got-connects)
	}
	if n := logs.Count("agent disconnected"); n != 0 {
		t.Fatalf("the agent reconnected (%d disconnections):\n%s", n, logs)
	}
	// The relay tells the agent of the promotion on the promoted tunnel,
	// which serves users meanwhile.
	Eventually(t, 5*time.Second, func() error {
		if n := logs.Count("agent moved to its standby tunnel"); n != 1 {
			return fmt.Errorf("the agent learnt of %d promotions, want 1:\n%s", n, logs)
		}
		return nil
	})
}

// TestKilledHolderMovesToStandbyAtOnce: a holder that dies (its address
// refuses connections, and every connection to it closes, as SIGKILL
// does) loses its device to the standby relay by promotion: the standby
// relay's probe connection to it closes, its probe is refused, it vetoes
// the holder and promotes the standby, and the agent, whose tunnel closed
// at the same moment, waits for that promotion instead of connecting
// again.
func TestKilledHolderMovesToStandbyAtOnce(t *testing.T) {
	sb, killed, user, logs, connects := standingBy(t, func(c *agent.Config) {
		c.PromotionWait = 5 * time.Second // the machine may be loaded: the promotion, not its speed, is tested here
	})

	killed.close()
	died := time.Now()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	Eventually(t, 8*time.Second, func() error { return userGet(c, sb, "robot-1", user) })
	t.Logf("served through the standby %v after the holder died", time.Since(died).Round(time.Millisecond))
	Eventually(t, 5*time.Second, func() error {
		if n := logs.Count("agent moved to its standby tunnel"); n != 1 {
			return fmt.Errorf("the agent learnt of %d promotions, want 1:\n%s", n, logs)
		}
		return nil
	})
	if got := sb.Node.TunnelConnects(); got != connects+1 {
		t.Fatalf("the standby relay took %d tunnels, want the promoted one alone\n%s", got-connects, logs)
	}
	if n := logs.Count("agent disconnected"); n != 0 {
		t.Fatalf("the agent reconnected (%d disconnections) rather than follow the promotion:\n%s", n, logs)
	}
}

// requestLoop sends GETs for device through each relay, one after another,
// until stop is closed, and counts those that fail.
type requestLoop struct {
	sent, failed atomic.Int64
	stop         chan struct{}
	done         chan struct{}
	mu           sync.Mutex
	errs         []error
}

func startRequests(t *testing.T, device, user string, relays ...*Relay) *requestLoop {
	l := &requestLoop{stop: make(chan struct{}), done: make(chan struct{})}
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	go func() {
		defer close(l.done)
		defer c.CloseIdleConnections()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			l.sent.Add(1)
			if err := userGet(c, relays[i%len(relays)], device, user); err != nil {
				l.failed.Add(1)
				l.mu.Lock()
				l.errs = append(l.errs, err)
				l.mu.Unlock()
			}
		}
	}()
	t.Cleanup(l.end)
	return l
}

// end stops the loop and waits for its last request.
func (l *requestLoop) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// check fails the test if a request failed or none was sent.
func (l *requestLoop) check(t *testing.T) {
	t.Helper()
	l.end()
	t.Logf("%d requests, %d failed", l.sent.Load(), l.failed.Load())
	if l.sent.Load() == 0 {
		t.Fatal("no request was sent")
	}
	if l.failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed: %v", l.failed.Load(), l.sent.Load(), l.errs)
	}
}

// TestDrainFlipsToStandby drains the relay holding a device: it asks the
// standby relay to promote the agent's standby tunnel, the device moves by
// that one directory write, the agent retires its old tunnel without
// reconnecting, and no request through either relay fails.
func TestDrainFlipsToStandby(t *testing.T) {
	relays, _ := standbyFleet(t, 2, func(_ int, c *node.Config) { c.DrainSpread = 200 * time.Millisecond })
	holder, sb, user, logs := robotWithStandby(t, relays)
	connects := sb.Node.TunnelConnects()

	reqs := startRequests(t, "robot-1", user, holder, sb)
	drained := time.Now()
	if err := holder.Node.Fleet().SetRelayDraining(t.Context(), holder.Node.Fleet().ID(), true); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 8*time.Second, func() error {
		if e, _ := holder.Node.Fleet().Entry("robot-1"); e.RelayID != sb.Node.Fleet().ID() {
			return fmt.Errorf("the directory records %+v", e)
		}
		if n := holder.Node.TunnelSessions(); n != 0 {
			return fmt.Errorf("the drained relay keeps %d tunnels", n)
		}
		return nil
	})
	// Well before the hand-over's grace: the agent retired its old tunnel.
	if took := time.Since(drained); took > 2*time.Second {
		t.Errorf("the drained relay kept the agent's old tunnel for %v", took)
	}
	reqs.check(t)
	if got := sb.Node.TunnelConnects(); got != connects+1 {
		t.Fatalf("the standby relay took %d tunnels, want the promoted one alone", got-connects)
	}
	if n := logs.Count("agent disconnected"); n != 0 {
		t.Fatalf("the agent reconnected (%d disconnections):\n%s", n, logs)
	}
	// The relay tells the agent of the promotion on the promoted tunnel,
	// which serves users meanwhile.
	Eventually(t, 5*time.Second, func() error {
		if n := logs.Count("agent moved to its standby tunnel"); n != 1 {
			return fmt.Errorf("the agent learnt of %d promotions, want 1:\n%s", n, logs)
		}
		return nil
	})
}

// TestPartitionedHolderStopsServing cuts the relay holding a device off
// from its peers (their probes and forwards to it go nowhere) while its
// agent and NATS still reach it: the standby relay vetoes it and promotes
// the standby, and the cut-off relay hands the device over at once — it
// keeps no tunnel of the device and forwards its users to the new holder —
// so that no request sent to it fails and the device is never served by
// both for longer than the veto takes.
func TestPartitionedHolderStopsServing(t *testing.T) {
	relays, fz := standbyFleet(t, 2, nil)
	holder, others := HolderFor(t, relays, "robot-1")
	sb := others[0]
	cut := fz[slices.Index(relays, holder)]
	backend := newBackend(t, "b")
	agentTok := FleetToken(t, relays, auth.KindAgent, "", "robot-*")
	user := FleetToken(t, relays, auth.KindUser, "u", "robot-1")
	StartAgent(t, holder, "robot-1", backend.URL, agentTok) // directly: the agent still reaches it
	holder.WaitDevice(t, "robot-1")
	standbyOf(t, holder, sb, "robot-1")

	reqs := startRequests(t, "robot-1", user, holder)
	cut.freeze()
	froze := time.Now()
	Eventually(t, 8*time.Second, func() error {
		if e, _ := holder.Node.Fleet().Entry("robot-1"); e.RelayID != sb.Node.Fleet().ID() {
			return fmt.Errorf("the directory records %+v", e)
		}
		if n := holder.Node.TunnelSessions(); n != 0 {
			return fmt.Errorf("the cut-off relay keeps %d tunnels", n)
		}
		return nil
	})
	took := time.Since(froze)
	t.Logf("the cut-off relay served the device for %v after the cut", took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("both relays held a tunnel of the device for %v", took)
	}
	if err := userGet(NewClient(t, true), sb, "robot-1", user); err != nil {
		t.Fatal(err)
	}
	reqs.check(t)
}

// TestStandbyNamedLater: an agent that connected while no other relay
// could keep its standby (the only other one drained) gets one named by
// its holder once that relay is back, and opens it there.
func TestStandbyNamedLater(t *testing.T) {
	relays, _ := standbyFleet(t, 2, nil)
	holder, later := relays[0], relays[1]
	device := deviceHeldBy(t, relays, holder)
	if err := holder.Node.Fleet().SetRelayDraining(t.Context(), later.Node.Fleet().ID(), true); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 5*time.Second, func() error {
		if _, ok := holder.Node.Fleet().Standby(device, "", nil); ok {
			return errors.New("the drained relay is still a standby candidate")
		}
		return nil
	})
	backend := newBackend(t, "b")
	agentTok := FleetToken(t, relays, auth.KindAgent, "", "robot-*")
	StartAgent(t, holder, device, backend.URL, agentTok, func(c *agent.Config) { c.StandbySpread = 100 * time.Millisecond })
	holder.WaitDevice(t, device)
	if n := later.Node.Standbys()[device]; n != 0 {
		t.Fatalf("a draining relay keeps %d standbys", n)
	}
	undrained := time.Now()
	if err := holder.Node.Fleet().SetRelayDraining(t.Context(), later.Node.Fleet().ID(), false); err != nil {
		t.Fatal(err)
	}
	standbyOf(t, holder, later, device)
	t.Logf("the standby stood by %v after the relay was undrained", time.Since(undrained).Round(time.Millisecond))
}

// TestDrainFlipsAllAtOnce drains a relay holding several devices with a
// long spread: every device with a standby moves by its standby's
// promotion as the drain begins, not at its agent's moment of the
// spread, and no agent reconnects.
func TestDrainFlipsAllAtOnce(t *testing.T) {
	relays, _ := standbyFleet(t, 2, func(_ int, c *node.Config) { c.DrainSpread = 20 * time.Second })
	HolderFor(t, relays, "robot-0") // every relay sees the other fresh
	backend := newBackend(t, "b")
	agentTok := FleetToken(t, relays, auth.KindAgent, "", "robot-*")
	logs := &testkit.Buffer{}
	var devices []string
	for i := range 8 {
		d := fmt.Sprintf("robot-%d", i)
		devices = append(devices, d)
		StartAgent(t, relays[i%2], d, backend.URL, agentTok, func(c *agent.Config) {
			c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		})
	}
	// Placement spreads the devices over both relays: drain the one
	// holding the most, once each device has its standby at the other.
	var holder, sb *Relay
	var held []string
	Eventually(t, 10*time.Second, func() error {
		byRelay := map[string][]string{}
		for _, d := range devices {
			e, ok := relays[0].Node.Fleet().Entry(d)
			if !ok || e.Agents == 0 || e.Standby == "" {
				return fmt.Errorf("the directory records %+v for %s", e, d)
			}
			byRelay[e.RelayID] = append(byRelay[e.RelayID], d)
		}
		holder, sb = relays[0], relays[1]
		if len(byRelay[sb.Node.Fleet().ID()]) > len(byRelay[holder.Node.Fleet().ID()]) {
			holder, sb = sb, holder
		}
		held = byRelay[holder.Node.Fleet().ID()]
		return nil
	})
	for _, d := range held {
		standbyOf(t, holder, sb, d)
	}
	connects := sb.Node.TunnelConnects()

	drained := time.Now()
	if err := holder.Node.Fleet().SetRelayDraining(t.Context(), holder.Node.Fleet().ID(), true); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 8*time.Second, func() error {
		for _, d := range held {
			if e, _ := holder.Node.Fleet().Entry(d); e.RelayID != sb.Node.Fleet().ID() {
				return fmt.Errorf("the directory records %+v", e)
			}
		}
		if n := holder.Node.TunnelSessions(); n != 0 {
			return fmt.Errorf("the drained relay keeps %d tunnels", n)
		}
		return nil
	})
	took := time.Since(drained)
	t.Logf("%d devices moved in %v of a %v spread", len(held), took.Round(time.Millisecond), 20*time.Second)
	if took > 4*time.Second {
		t.Errorf("the devices took %v to move: the drain spread them", took)
	}
	if got := sb.Node.TunnelConnects(); got != connects+int64(len(held)) {
		t.Fatalf("the standby relay took %d tunnels, want the %d promoted ones alone", got-connects, len(held))
	}
	if n := logs.Count("agent disconnected"); n != 0 {
		t.Fatalf("an agent reconnected (%d disconnections):\n%s", n, logs)
	}
	if n := logs.Count("agent moved to its standby tunnel"); n != len(held) {
		t.Fatalf("the agents learnt of %d promotions, want %d:\n%s", n, len(held), logs)
	}
}

// TestPromotionLandedLateIsPromoted: a standby relay whose promotion's
// directory write timed out but landed (a NATS cluster regaining its
// quorum) is recorded as the holder while it keeps only the standby. It
// promotes the standby when it sees that, so that the users the fleet now
// routes to it are served, and the agent follows.
func TestPromotionLandedLateIsPromoted(t *testing.T) {
	relays, _ := standbyFleet(t, 2, nil)
	holder, sb, user, logs := robotWithStandby(t, relays)

	// The write alone, as if it landed after the relay gave up on it: the
	// relay itself promotes nothing.
	if errs := sb.Node.Fleet().ClaimPromoted(t.Context(), []fleet.Claim{{Device: "robot-1", Agents: 1}}, nil); errs[0] != nil {
		t.Fatal(errs[0])
	}
	Eventually(t, 10*time.Second, func() error {
		if n := sb.Node.TunnelSessions(); n != 1 {
			return fmt.Errorf("the relay recorded as the holder keeps %d tunnels, want the promoted one", n)
		}
		if n := logs.Count("agent moved to its standby tunnel"); n != 1 {
			return fmt.Errorf("the agent learnt of %d promotions, want 1", n)
		}
		if n := holder.Node.TunnelSessions(); n != 0 {
			return fmt.Errorf("the old holder keeps %d tunnels", n)
		}
		return nil
	})
	c := &http.Client{Timeout: 5 * time.Second}
	for _, r := range relays {
		if err := userGet(c, r, "robot-1", user); err != nil {
			t.Error(err)
		}
	}
	if n := logs.Count("agent disconnected"); n != 0 {
		t.Fatalf("the agent reconnected (%d disconnections):\n%s", n, logs)
	}
}
