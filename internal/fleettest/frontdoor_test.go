package fleettest

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

func keepArriving(c *node.Config) { c.KeepArrivingAgents = true }

// TestKeepArrivingAgentsStayWhereTheyArrive puts agents of both protocols
// on a relay the ranking would not pick, as a front door hashing on the
// device does: with KeepArrivingAgents that relay keeps the device, and
// users' requests there need no forward hop. Once that agent has gone, the
// device's next agent arriving at another relay is kept there too, with no
// redirect back to the relay that had it.
func TestKeepArrivingAgentsStayWhereTheyArrive(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		relays := StartFleet(t, 3, keepArriving)
		_, others := HolderFor(t, relays, "dev")
		b := newBackend(t, "b1")
		tok := FleetToken(t, relays, auth.KindAgent, "", "dev")
		user := FleetToken(t, relays, auth.KindUser, "u", "dev")
		first := StartAgent(t, others[0], "dev", b.URL, tok, protocol(proto))
		waitHolder(t, relays, "dev", others[0])
		resp := do(t, http.MethodGet, others[0].URL+"/client/dev/echo/x", user, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET through the relay the agent reached: %s", resp.Status)
		}
		if n := forwards(t, others[0]); n != 0 {
			t.Errorf("the relay holding the device forwarded %v requests", n)
		}

		first.Stop()
		StartAgent(t, others[1], "dev", b.URL, tok, protocol(proto))
		waitHolder(t, relays, "dev", others[1])
	})
}

// steered is a TCP front door that sends every new connection to one
// relay, which the test changes, as a hashing front door does when a relay
// comes back and gets its share of devices again.
type steered struct {
	*roundRobin
	to atomic.Value // string: the relay's base URL
}

func startSteered(t *testing.T, to string) *steered {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &steered{roundRobin: &roundRobin{ln: ln, conns: map[net.Conn]bool{}}}
	s.to.Store(to)
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			target := s.to.Load().(string)
			s.wg.Go(func() { s.pipe(c, target) })
		}
	})
	t.Cleanup(s.close)
	return s
}

// TestKeepArrivingAgentsSentBack: a native agent holds its device on the
// relay its front door sent it to; then the front door sends the device to
// another relay (as when a relay comes back after a failure). The first
// user's request entering there has that relay ask for the agent, which
// the holder sends back through the front door with a GOAWAY; the device
// lands where its users are, and their requests no longer take a hop.
func TestKeepArrivingAgentsSentBack(t *testing.T) {
	relays := StartFleet(t, 3, keepArriving)
	_, others := HolderFor(t, relays, "dev")
	from, to := others[0], others[1]
	front := startSteered(t, from.URL)
	b := newBackend(t, "b1")
	user := FleetToken(t, relays, auth.KindUser, "u", "dev")
	StartAgent(t, &Relay{URL: front.URL()}, "dev", b.URL, FleetToken(t, relays, auth.KindAgent, "", "dev"))
	waitHolder(t, relays, "dev", from)

	front.to.Store(to.URL)
	resp := do(t, http.MethodGet, to.URL+"/client/dev/echo/first", user, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the first request at the front door's new choice: %s", resp.Status)
	}
	waitHolder(t, relays, "dev", to)
	Eventually(t, 10*time.Second, func() error {
		if !slices.Contains(to.Node.Devices(), "dev") {
			return errNotYet
		}
		return nil
	})
	before := forwards(t, to)
	for range 5 {
		resp := do(t, http.MethodGet, to.URL+"/client/dev/echo/after", user, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("after the move: %s", resp.Status)
		}
	}
	if n := forwards(t, to) - before; n != 0 {
		t.Errorf("%v requests forwarded after the agent came to their relay", n)
	}
}

// TestKeepArrivingAgentsListsNoRelays checks a native handshake's answer at
// a relay the ranking would not pick: with KeepArrivingAgents the agent is
// taken (101) and given no relay list to walk past the front door; without
// it the agent is redirected (307) with the list.
func TestKeepArrivingAgentsListsNoRelays(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			relays := StartFleet(t, 3, func(c *node.Config) { c.KeepArrivingAgents = keep })
			_, others := HolderFor(t, relays, "dev")
			tok := FleetToken(t, relays, auth.KindAgent, "", "dev")
			resp := handshake(t, others[0], tok)
			want := http.StatusTemporaryRedirect
			if keep {
				want = http.StatusSwitchingProtocols
			}
			list := resp.Header.Get(tunnel.RelaysHeader)
			if resp.StatusCode != want || keep != (list == "") {
				t.Errorf("handshake: %s with relays %q, want %d and a list only without the option", resp.Status, list, want)
			}
		})
	}
}

// TestKeepArrivingAgentsRefusedWhileDraining: a draining relay turns an
// arriving agent away with 503, to come back through the front door, rather
// than redirecting it past the front door.
func TestKeepArrivingAgentsRefusedWhileDraining(t *testing.T) {
	relays := StartFleet(t, 2, keepArriving)
	HolderFor(t, relays, "dev")
	tok := FleetToken(t, relays, auth.KindAgent, "", "dev")
	if err := relays[1].Node.Fleet().SetRelayDraining(t.Context(), relays[0].Node.Fleet().ID(), true); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, func() error {
		if !relays[0].Node.Fleet().ShouldDrain() {
			return errNotYet
		}
		return nil
	})
	resp := handshake(t, relays[0], tok)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Location") != "" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("handshake at a draining relay: %s, Location %q", resp.Status, resp.Header.Get("Location"))
	}
}

// handshake opens a native tunnel handshake for dev at r and returns the
// answer, its connection closed when the test ends.
func handshake(t *testing.T, r *Relay, token string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.URL+tunnel.Path+"?device=dev", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", tunnel.Protocol)
	c := NewClient(t, false)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// forwards reads switchboard_router_forwards_total{outcome="ok"} from r's metrics.
func forwards(t *testing.T, r *Relay) float64 {
	t.Helper()
	code, body, err := fetch(NewClient(t, false), r.AdminURL+"/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, `switchboard_router_forwards_total{outcome="ok"} `); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatal("no switchboard_router_forwards_total on /metrics")
	return 0
}
