package fleettest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// echoService serves a TCP echo on loopback until the test ends.
func echoService(t *testing.T) string {
	return testkit.ServeTCP(t, func(c net.Conn) { io.Copy(c, c) })
}

// withServices gives an agent the services named as by --service.
func withServices(t *testing.T, specs ...string) func(*agent.Config) {
	var list []service.Service
	for _, s := range specs {
		sv, err := service.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, sv)
	}
	return func(c *agent.Config) { c.Services = list }
}

// connectClient returns a connect client of relay r with token, closed
// when the test ends.
func connectClient(t *testing.T, r *Relay, token string) *connect.Client {
	u, err := url.Parse(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := connect.NewClient(connect.ClientConfig{Relay: u, Token: token})
	t.Cleanup(func() { c.Close() })
	return c
}

// echoOnce sends a line on a new connection to target and returns what
// comes back, or the connection's error.
func echoOnce(ctx context.Context, c *connect.Client, target, line string) (string, net.Conn, error) {
	tg, err := connect.ParseTarget(target)
	if err != nil {
		return "", nil, err
	}
	conn, err := c.Dial(ctx, tg)
	if err != nil {
		return "", nil, err
	}
	if _, err := io.WriteString(conn, line+"\n"); err != nil {
		conn.Close()
		return "", nil, err
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		conn.Close()
		return "", nil, err
	}
	return got[:len(got)-1], conn, nil
}

// TestConnectThroughFleet: switchboard connect reaches a device's TCP
// service through the relay holding the device and through another, one
// hop; refusals name their cause; revoking the token ends the session.
func TestConnectThroughFleet(t *testing.T) {
	relays := StartFleet(t, 2)
	holder, others := HolderFor(t, relays, "robot")
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "echo=tcp://"+echoService(t), "closed=tcp://127.0.0.1:1"))
	holder.WaitDevice(t, "robot")
	userTok := FleetToken(t, relays, auth.KindUser, "alice", "robot")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for name, r := range map[string]*Relay{"holder": holder, "other": others[0]} {
		c := connectClient(t, r, userTok)
		got, conn, err := echoOnce(ctx, c, "robot/echo", "hello "+name)
		if err != nil || got != "hello "+name {
			t.Fatalf("through the %s: %q, %v", name, got, err)
		}
		conn.Close()
		for target, want := range map[string]error{
			"robot/nope":   connect.ErrUnknownService,
			"robot/closed": connect.ErrRefused,
			"ghost/echo":   connect.ErrForbidden, // the token is for robot alone
		} {
			if _, _, err := echoOnce(ctx, c, target, "x"); !errors.Is(err, want) {
				t.Errorf("through the %s, %s: %v, want %v", name, target, err, want)
			}
		}
	}

	// A device with no agent anywhere.
	anyTok := FleetToken(t, relays, auth.KindUser, "bob")
	for _, r := range relays {
		if _, _, err := echoOnce(ctx, connectClient(t, r, anyTok), "ghost/echo", "x"); !errors.Is(err, connect.ErrNoDevice) {
			t.Errorf("a device with no agent: %v, want ErrNoDevice", err)
		}
	}

	// Revocation ends the sessions the token opened, on every relay.
	var open []net.Conn
	for _, r := range relays {
		_, conn, err := echoOnce(ctx, connectClient(t, r, userTok), "robot/echo", "before")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		open = append(open, conn)
	}
	p, err := relays[0].Node.Tokens().Authenticate(userTok)
	if err != nil {
		t.Fatal(err)
	}
	if err := relays[0].Node.Tokens().Revoke(ctx, p.TokenID); err != nil {
		t.Fatal(err)
	}
	for i, conn := range open {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("relay %d: a revoked token's connection reads on: %v", i, err)
		}
	}
}

// TestConnectStreamsEndWithTheAgent: when the device's agent goes, its
// streams end.
func TestConnectStreamsEndWithTheAgent(t *testing.T) {
	r := StartRelay(t, func(c *node.Config) { c.AllowAnonymousUsers, c.AllowAnonymousAgents = true, true })
	a := StartAgent(t, r, "robot", "http://127.0.0.1:1", "", withServices(t, "echo=tcp://"+echoService(t)))
	r.WaitDevice(t, "robot")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, conn, err := echoOnce(ctx, connectClient(t, r, ""), "robot/echo", "hi")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	a.Stop()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stream outlived its device's agent: %v", err)
	}
}
