package fleettest

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"
)

// metricsHave waits until the /metrics that client reads at url hold
// every line of want.
func metricsHave(t *testing.T, client *http.Client, url string, want ...string) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		resp, err := client.Get(url + "/metrics")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, l := range want {
			if !strings.Contains(string(body), l) {
				return fmt.Errorf("no %s in /metrics", l)
			}
		}
		return nil
	})
}

// cutEvent waits until the fleet's event log, read from r, holds the
// tcp.cut event of relay id saying it cut n connections.
func cutEvent(t *testing.T, r *Relay, client *http.Client, id string, n int) {
	t.Helper()
	cl := &control.Client{BaseURL: r.AdminURL, Token: r.AdminToken, HTTPClient: client}
	Eventually(t, 10*time.Second, func() error {
		events, err := cl.Events(t.Context(), 100)
		if err != nil {
			return err
		}
		for _, e := range events {
			if e.Type == tcpconns.EventCut && e.RelayID == id && strings.Contains(e.Message, fmt.Sprintf("cut %d TCP connections", n)) {
				return nil
			}
		}
		return fmt.Errorf("no %s event of %s saying %d in %d events", tcpconns.EventCut, id, n, len(events))
	})
}

// TestUDPFlowsCountedAndDrained: a UDP flow through a mapped port and one
// of switchboard connect --udp are counted as connections are, each kind
// apart (port_udp, connect_udp), recorded as fleet events naming the
// user's address; a drain waits for them, and cuts them at its deadline.
func TestUDPFlowsCountedAndDrained(t *testing.T) {
	relays, hosts := portFleet(t, func(c *node.Config) { c.DrainSpread = time.Millisecond })
	holder, others := HolderFor(t, relays, "robot")
	host := hosts[0]
	if holder != relays[0] {
		host = hosts[1]
	}
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "voice=udp://"+udpEchoService(t)), knowsAll(t, relays))
	holder.WaitDevice(t, "robot")
	probe, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(probe.LocalAddr().(*net.UDPAddr).Port)
	probe.Close()
	mustCtl(t, holder, "ports", "add", port, "robot/voice", "--udp")
	mapped, err := net.Dial("udp", net.JoinHostPort(host, port))
	if err != nil {
		t.Fatal(err)
	}
	defer mapped.Close()
	Eventually(t, 10*time.Second, func() error { _, err := udpExchange(mapped, "up"); return err })
	userTok := FleetToken(t, relays, auth.KindUser, "alice", "robot")
	viaConnect, err := net.Dial("udp", connectUDP(t, holder, userTok, connect.Target{Device: "robot", Service: "voice"}))
	if err != nil {
		t.Fatal(err)
	}
	defer viaConnect.Close()
	if got, err := udpExchange(viaConnect, "hello"); err != nil || got != "HELLO" {
		t.Fatalf("through connect: %q, %v", got, err)
	}

	metricsHave(t, http.DefaultClient, holder.AdminURL,
		`switchboard_tcp_connections_open{kind="port_udp",name="`+port+`"} 1`,
		`switchboard_tcp_connections_open{kind="connect_udp",name="voice"} 1`,
		`switchboard_tcp_connections_total{kind="connect_udp",name="voice"} 1`)
	cl := &control.Client{BaseURL: holder.AdminURL, Token: holder.AdminToken}
	Eventually(t, 10*time.Second, func() error {
		events, err := cl.Events(t.Context(), 100)
		if err != nil {
			return err
		}
		seen := 0
		for _, e := range events {
			if e.Type == tcpconns.EventConnected && e.Device == "robot" && strings.Contains(e.Message, "127.0.0.") &&
				(strings.Contains(e.Message, "port_udp") || strings.Contains(e.Message, "connect_udp")) {
				seen++
			}
		}
		if seen < 2 {
			return fmt.Errorf("%d flows' events naming the user's address, want 2", seen)
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := holder.Node.Shutdown(ctx); err == nil {
		t.Fatal("a drain that cut two UDP flows reported no error")
	}
	cutEvent(t, others[0], http.DefaultClient, holder.Node.Fleet().ID(), 2)
}

// TestPassthroughCountedAndDrained: a TLS passthrough is counted as a
// connection of kind passthrough, labelled by its service, and a refused
// name by reason without the name the user typed; a drain waits for the
// passthrough and cuts it at its deadline.
func TestPassthroughCountedAndDrained(t *testing.T) {
	relayCA, deviceCA := NewCA(t), NewCA(t)
	relays := StartTLSFleet(t, 2, relayCA, func(c *node.Config) {
		c.SNIZone = sniZone
		c.DrainSpread = time.Millisecond
	})
	holder, others := HolderFor(t, relays, "robot")
	web := deviceTLSServer(t, deviceCA, "web--robot."+sniZone)
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, trusting(relayCA), knowsAll(t, relays),
		withServices(t, "web=tcp://"+web), func(c *agent.Config) { c.Passthrough = []string{"web"} })
	holder.WaitDevice(t, "robot")

	conn, err := tls.Dial("tcp", holder.Node.Addr(), &tls.Config{ServerName: "web--robot." + sniZone, RootCAs: deviceCA.Pool})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if c, err := tls.Dial("tcp", holder.Node.Addr(), &tls.Config{ServerName: "typed-by-a-user." + sniZone, RootCAs: deviceCA.Pool}); err == nil {
		c.Close()
		t.Fatal("a name not of the form SERVICE--DEVICE was passed through")
	}
	admin := relayCA.Client(t, false)
	metricsHave(t, admin, holder.AdminURL,
		`switchboard_tcp_connections_open{kind="passthrough",name="web"} 1`,
		`switchboard_tcp_refusals_total{kind="passthrough",name="_other",reason="bad_target"} 1`)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := holder.Node.Shutdown(ctx); err == nil {
		t.Fatal("a drain that cut a passthrough reported no error")
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("the passthrough after the drain: %v, want it cut", err)
	}
	cutEvent(t, others[0], admin, holder.Node.Fleet().ID(), 1)
}
