package fleettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"
)

// tcpDrainFleet starts two relays with a device whose echo service is
// mapped on a port, and opens a TCP connection to the holder through the
// mapped port and a stream of switchboard connect. It returns the holder,
// the other relay and the two connections, each already echoing.
func tcpDrainFleet(t *testing.T) (holder, other *Relay, addr string, conns map[string]*lineConn) {
	// A drain sends the agents on at once, not spread over seconds.
	relays, hosts := portFleet(t, func(c *node.Config) { c.DrainSpread = time.Millisecond })
	holder, others := HolderFor(t, relays, "robot")
	other = others[0]
	host := hosts[0]
	if holder != relays[0] {
		host = hosts[1]
	}
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "echo=tcp://"+echoService(t)), knowsAll(t, relays))
	holder.WaitDevice(t, "robot")
	port := strconv.Itoa(freePort(t))
	mustCtl(t, holder, "ports", "add", port, "robot/echo")
	addr = net.JoinHostPort(host, port)
	Eventually(t, 10*time.Second, func() error { _, err := echoPort(addr, "up"); return err })

	mapped, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mapped.Close() })
	userTok := FleetToken(t, relays, auth.KindUser, "alice", "robot")
	_, stream, err := echoOnce(t.Context(), connectClient(t, holder, userTok), "robot/echo", "up")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Close() })
	conns = map[string]*lineConn{"mapped port": newLineConn(mapped), "connect": newLineConn(stream)}
	for name, c := range conns {
		if err := c.echo("before the drain"); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return holder, other, addr, conns
}

// lineConn is a connection to an echo service, spoken a line at a time.
type lineConn struct {
	net.Conn
	r *bufio.Reader
}

func newLineConn(c net.Conn) *lineConn { return &lineConn{Conn: c, r: bufio.NewReader(c)} }

// echo sends line and reads it back.
func (c *lineConn) echo(line string) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := c.r.ReadString('\n')
	if err == nil && got != line+"\n" {
		err = fmt.Errorf("echoed %q, want %q", got, line)
	}
	return err
}

// TestDrainWaitsForTCPConnections: a relay that drains keeps carrying the
// TCP connections open through it (a mapped port's, a connect stream),
// while the device's agent moves to the other relay at once, so that a new
// connection to the draining relay's mapped port reaches the device there;
// and the relay stops as soon as its connections end, well before its deadline.
func TestDrainWaitsForTCPConnections(t *testing.T) {
	holder, other, addr, conns := tcpDrainFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- holder.Node.Shutdown(ctx) }()
	Eventually(t, 5*time.Second, func() error {
		if holder.Node.Ready() {
			return errors.New("the relay does not drain yet")
		}
		return nil
	})
	// The device's agent moves though its old tunnel still carries the
	// connections.
	Eventually(t, 10*time.Second, func() error {
		e, err := other.Node.Fleet().Device("robot")
		if err != nil || e.RelayID != other.Node.Fleet().ID() || e.Agents == 0 {
			return fmt.Errorf("the device has not moved yet: %+v, %v", e, err)
		}
		return nil
	})
	Eventually(t, 10*time.Second, func() error {
		got, err := echoPort(addr, "new during the drain")
		if err == nil && got != "new during the drain" {
			err = fmt.Errorf("echoed %q", got)
		}
		return err
	})
	for name, c := range conns {
		if err := c.echo("during the drain"); err != nil {
			t.Fatalf("%s during the drain: %v", name, err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the drain ended with TCP connections open: %v", err)
	default:
	}
	for _, c := range conns {
		c.Close()
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("drain: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the drain did not end once the TCP connections had")
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("the drain took %v", took)
	}
}

// TestDrainCutsTCPConnectionsAtDeadline: TCP connections still open at the
// drain's deadline are cut, and the relay says how many in the fleet's
// event log.
func TestDrainCutsTCPConnectionsAtDeadline(t *testing.T) {
	holder, other, _, conns := tcpDrainFleet(t)
	id := holder.Node.Fleet().ID()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := holder.Node.Shutdown(ctx); err == nil {
		t.Fatal("a drain that cut TCP connections reported no error")
	}
	for name, c := range conns {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.r.ReadByte(); err == nil || isTimeout(err) {
			t.Errorf("%s after the drain: %v, want it cut", name, err)
		}
	}
	c := &control.Client{BaseURL: other.AdminURL, Token: other.AdminToken}
	Eventually(t, 10*time.Second, func() error {
		events, err := c.Events(t.Context(), 100)
		if err != nil {
			return err
		}
		for _, e := range events {
			if e.Type == tcpconns.EventCut && e.RelayID == id && strings.Contains(e.Message, "cut 2 TCP connections") {
				return nil
			}
		}
		return fmt.Errorf("no %s event of %s saying 2 in %d events", tcpconns.EventCut, id, len(events))
	})
}
