package fleettest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// echoVia asks device's /echo/ through relay r and returns which backend
// answered, or an error.
func echoVia(r *Relay, token, device string) (string, error) {
	req, _ := http.NewRequest(http.MethodGet, r.URL+"/client/"+device+"/echo/x", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, body)
	}
	var e echoReply
	if err := json.Unmarshal(body, &e); err != nil {
		return "", err
	}
	return e.Backend, nil
}

// waitVersions waits until device's agents on the relays rs speak the
// tunnel versions want (in any order).
func waitVersions(t *testing.T, rs []*Relay, device string, want ...int) {
	t.Helper()
	slices.Sort(want)
	Eventually(t, 10*time.Second, func() error {
		var got []int
		for _, r := range rs {
			got = append(got, r.Node.TunnelVersions(device)...)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s: tunnel versions %v, want %v", device, got, want)
		}
		return nil
	})
}

// TestMixedAgentVersions runs a fleet whose devices are served by agents
// of both tunnel versions and the long-poll protocol, one device by a v1
// and a v2 agent together, as during a rolling update of the agents: users
// reach every device through every relay.
func TestMixedAgentVersions(t *testing.T) {
	relays := StartFleet(t, 3)
	devices := map[string][]string{
		"new-1":  {agent.ProtocolNative},
		"new-2":  {agent.ProtocolNative},
		"old-1":  {protocolNativeV1},
		"old-2":  {protocolNativeV1},
		"lp-1":   {agent.ProtocolLongPoll},
		"both-1": {protocolNativeV1, agent.ProtocolNative},
	}
	var names []string
	for dev, protos := range devices {
		names = append(names, dev)
		holder, _ := HolderFor(t, relays, dev)
		b := newBackend(t, dev)
		var versions []int
		for _, p := range protos {
			StartAgent(t, holder, dev, b.URL, FleetToken(t, relays, auth.KindAgent, "", dev), protocol(p))
			switch p {
			case agent.ProtocolNative:
				versions = append(versions, tunnel.V2)
			case protocolNativeV1:
				versions = append(versions, tunnel.V1)
			}
		}
		if len(versions) > 0 {
			// Where the agents stay also depends on the other devices'
			// load: count them on any relay.
			waitVersions(t, relays, dev, versions...)
		}
	}
	user := FleetToken(t, relays, auth.KindUser, "u", names...)
	for _, r := range relays {
		for dev := range devices {
			Eventually(t, 10*time.Second, func() error {
				got, err := echoVia(r, user, dev)
				if err == nil && got != dev {
					err = fmt.Errorf("answered by %s", got)
				}
				return err
			})
		}
	}
}

// TestNewAgentOldRelay: a version 2 agent against relays that know only
// version 1 (as before the update) falls back to version 1 at once, by
// HTTP Upgrade and by WebSocket, and serves; a relay updated meanwhile
// takes the same kind of agent at version 2, and users reach both devices
// through either relay.
func TestNewAgentOldRelay(t *testing.T) {
	old := StartRelay(t, func(c *node.Config) { c.TunnelV1Only = true })
	for _, ws := range []bool{false, true} {
		dev := "dev"
		if ws {
			dev = "dev-ws"
		}
		b := newBackend(t, dev)
		StartAgent(t, old, dev, b.URL, old.Token(t, auth.KindAgent, "", dev), protocol(agent.ProtocolNative),
			func(c *agent.Config) { c.WebSocket = ws })
		waitVersions(t, []*Relay{old}, dev, tunnel.V1)
		if got, err := echoVia(old, old.Token(t, auth.KindUser, "u", dev), dev); err != nil || got != dev {
			t.Fatalf("websocket=%v: %q, %v", ws, got, err)
		}
	}

	started := 0
	relays := StartFleet(t, 2, func(c *node.Config) {
		started++
		c.TunnelV1Only = started == 2 // the second relay is not updated yet
	})
	// One device held by each relay.
	held := map[*Relay]string{}
	for i := 0; len(held) < len(relays) && i < 100; i++ {
		dev := fmt.Sprintf("mixed-%d", i)
		if holder, _ := HolderFor(t, relays, dev); held[holder] == "" {
			held[holder] = dev
		}
	}
	var names []string
	for holder, dev := range held {
		names = append(names, dev)
		StartAgent(t, holder, dev, newBackend(t, dev).URL, FleetToken(t, relays, auth.KindAgent, "", dev), protocol(agent.ProtocolNative))
		want := tunnel.V2
		if holder == relays[1] {
			want = tunnel.V1
		}
		waitVersions(t, []*Relay{holder}, dev, want)
	}
	if len(names) != len(relays) {
		t.Fatalf("devices held: %v", held)
	}
	user := FleetToken(t, relays, auth.KindUser, "u", names...)
	for _, r := range relays {
		for _, dev := range names {
			Eventually(t, 10*time.Second, func() error {
				got, err := echoVia(r, user, dev)
				if err == nil && got != dev {
					err = fmt.Errorf("answered by %s", got)
				}
				return err
			})
		}
	}
}

// TestV2ServiceRefused: a device whose agent cannot connect to its
// service answers 502 saying so, at once.
func TestV2ServiceRefused(t *testing.T) {
	r := StartRelay(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens: the agent's connection is refused
	StartAgent(t, r, "dev", "http://"+addr, r.Token(t, auth.KindAgent, "", "dev"), protocol(agent.ProtocolNative))
	waitVersions(t, []*Relay{r}, "dev", tunnel.V2)
	req, _ := http.NewRequest(http.MethodGet, r.URL+"/client/dev/", nil)
	req.Header.Set("Authorization", "Bearer "+r.Token(t, auth.KindUser, "u", "dev"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "refused the connection") {
		t.Fatalf("%s: %s", resp.Status, body)
	}
}
