package fleettest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"
)

// TestTCPMetricsAndEvents: each relay counts the TCP connections it takes
// from users, per kind and service or port and never per device, with the
// bytes each way and the refusals by reason; each connection's opening and
// end are fleet events naming the user's address.
func TestTCPMetricsAndEvents(t *testing.T) {
	relays, hosts := portFleet(t)
	holder, others := HolderFor(t, relays, "robot")
	other := others[0]
	host := hosts[0]
	if holder != relays[0] {
		host = hosts[1]
	}
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "echo=tcp://"+echoService(t)))
	holder.WaitDevice(t, "robot")
	port := strconv.Itoa(freePort(t))
	mustCtl(t, holder, "ports", "add", port, "robot/echo")
	addr := net.JoinHostPort(host, port)
	Eventually(t, 10*time.Second, func() error { _, err := echoPort(addr, "hello port"); return err })

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	userTok := FleetToken(t, relays, auth.KindUser, "alice", "robot")
	c := connectClient(t, other, userTok)
	_, conn, err := echoOnce(ctx, c, "robot/echo", "hello connect")
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if _, _, err := echoOnce(ctx, c, "robot/no-such-service-typed-by-a-user", "x"); !errors.Is(err, connect.ErrUnknownService) {
		t.Fatalf("an unknown service: %v", err)
	}

	want := map[*Relay][]string{
		holder: {`switchboard_tcp_connections_total{kind="port",name="` + port + `"}`,
			`switchboard_tcp_bytes_total{direction="to_device",kind="port",name="` + port + `"}`},
		other: {`switchboard_tcp_connections_total{kind="connect",name="echo"} 1`,
			`switchboard_tcp_bytes_total{direction="from_device",kind="connect",name="echo"} 14`,
			`switchboard_tcp_refusals_total{kind="connect",name="_other",reason="unknown_service"} 1`,
			`switchboard_tcp_connection_duration_seconds_count{kind="connect",name="echo"} 1`,
			`switchboard_tcp_connections_open{kind="connect",name="echo"} 0`},
	}
	for r, lines := range want {
		Eventually(t, 10*time.Second, func() error {
			_, body, _ := get(t, r.AdminURL+"/metrics")
			for _, l := range lines {
				if !strings.Contains(body, l) {
					return fmt.Errorf("no %s in /metrics", l)
				}
			}
			for _, l := range strings.Split(body, "\n") {
				if strings.HasPrefix(l, "switchboard_tcp_") && (strings.Contains(l, "robot") || strings.Contains(l, "typed")) {
					return fmt.Errorf("a TCP metric names a device or a typed name: %s", l)
				}
			}
			return nil
		})
	}
	_, body, _ := get(t, holder.AdminURL+"/metrics")
	if strings.Contains(body, `switchboard_tcp_connections_total{kind="connect"`) {
		t.Error("the holder counted the connect stream forwarded to it: it is counted where the user came in")
	}

	cl := &control.Client{BaseURL: holder.AdminURL, Token: holder.AdminToken}
	Eventually(t, 10*time.Second, func() error {
		events, err := cl.Events(t.Context(), 100)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, e := range events {
			if e.Device == "robot" && strings.Contains(e.Message, "127.0.0.") {
				seen[e.Type+" "+e.RelayID] = true
			}
		}
		for _, k := range []string{
			tcpconns.EventConnected + " " + holder.Node.Fleet().ID(), tcpconns.EventDisconnected + " " + holder.Node.Fleet().ID(),
			tcpconns.EventConnected + " " + other.Node.Fleet().ID(), tcpconns.EventDisconnected + " " + other.Node.Fleet().ID(),
		} {
			if !seen[k] {
				return fmt.Errorf("no event %s naming the user's address; seen %v", k, seen)
			}
		}
		return nil
	})
}
