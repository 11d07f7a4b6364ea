package fleettest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// portFleet starts two relays on one NATS server, their public listeners
// on loopback addresses of their own (127.0.0.1 and 127.0.0.2), so that
// both can listen on the same mapped port as relays on two hosts do. It
// returns the relays with their hosts. Options apply to every relay, after
// those.
func portFleet(t *testing.T, opts ...func(*node.Config)) ([]*Relay, []string) {
	t.Helper()
	st, err := store.Open(context.Background(), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start the fleet's NATS: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	hosts := []string{"127.0.0.1", "127.0.0.2"}
	var relays []*Relay
	for _, host := range hosts {
		relays = append(relays, StartRelay(t, append([]func(*node.Config){FastFleet, func(c *node.Config) {
			c.NATS = []string{st.ClientURL()}
			c.Listen = net.JoinHostPort(host, "0")
		}}, opts...)...))
	}
	return relays, hosts
}

// mustCtl runs 'switchboard ctl' against relay r and fails the test
// unless it succeeds.
func mustCtl(t *testing.T, r *Relay, args ...string) {
	t.Helper()
	if code, _, stderr := ctl(t.Context(), r, args...); code != 0 {
		t.Fatalf("ctl %s: exit %d: %s", strings.Join(args, " "), code, stderr)
	}
}

// echoPort sends a line through a mapped port and returns what came back.
func echoPort(addr, line string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

// TestPortsThroughFleet: a port mapped by ctl opens on every relay, and a
// connection to it on either reaches the device's service, through the
// relay that holds the device or one hop to it; mapping it again is
// refused; an allowlist closes other sources' connections at once;
// unmapping closes the port everywhere.
func TestPortsThroughFleet(t *testing.T) {
	relays, hosts := portFleet(t)
	holder, _ := HolderFor(t, relays, "robot")
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "echo=tcp://"+echoService(t)))
	holder.WaitDevice(t, "robot")

	port := strconv.Itoa(freePort(t))
	mustCtl(t, relays[0], "ports", "add", port, "robot/echo")
	for i, host := range hosts {
		addr := net.JoinHostPort(host, port)
		line := "hello relay " + strconv.Itoa(i)
		Eventually(t, 10*time.Second, func() error {
			got, err := echoPort(addr, line)
			if err == nil && got != line {
				err = fmt.Errorf("%s echoed %q, want %q", addr, got, line)
			}
			return err
		})
	}

	c := &control.Client{BaseURL: relays[1].AdminURL, Token: relays[1].AdminToken}
	_, err := c.AddPort(t.Context(), control.PortRequest{Port: mustAtoi(t, port), Target: "robot/other"})
	if apiErr, ok := errors.AsType[*control.APIError](err); !ok || apiErr.Status != http.StatusConflict {
		t.Fatalf("mapping a mapped port: %v, want 409", err)
	}

	mustCtl(t, relays[1], "ports", "remove", port)
	for _, host := range hosts {
		addr := net.JoinHostPort(host, port)
		Eventually(t, 10*time.Second, func() error {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return nil
			}
			c.Close()
			return fmt.Errorf("%s still accepts after the unmapping", addr)
		})
	}

	// An allowlist without loopback: the port is open, and closes each
	// connection before anything reaches the service.
	mustCtl(t, relays[0], "ports", "add", port, "robot/echo", "--allow", "192.0.2.0/24")
	for _, host := range hosts {
		addr := net.JoinHostPort(host, port)
		Eventually(t, 10*time.Second, func() error {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return err // not open yet
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, "let me in\n")
			n, err := c.Read(make([]byte, 64))
			if n > 0 || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
				return fmt.Errorf("%s: a source outside the allowlist got %d bytes, %v", addr, n, err)
			}
			return nil
		})
	}
}

// TestPortsRedis: redis-cli reaches a real Redis server behind an agent
// through a mapped port of each relay.
func TestPortsRedis(t *testing.T) {
	server := testkit.Tool(t, "redis-server", "SWITCHBOARD_REQUIRE_REDIS")
	redisCLI := testkit.Tool(t, "redis-cli", "SWITCHBOARD_REQUIRE_REDIS")
	redisPort := strconv.Itoa(freePort(t))
	var redisLog bytes.Buffer
	cmd := exec.Command(server, "--port", redisPort, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	cmd.Stdout, cmd.Stderr = &redisLog, &redisLog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("redis-server said:\n%s", redisLog.String())
		}
	})
	redisAddr := net.JoinHostPort("127.0.0.1", redisPort)
	Eventually(t, 10*time.Second, func() error {
		c, err := net.Dial("tcp", redisAddr)
		if err == nil {
			c.Close()
		}
		return err
	})

	relays, hosts := portFleet(t)
	holder, _ := HolderFor(t, relays, "robot")
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "redis=tcp://"+redisAddr))
	holder.WaitDevice(t, "robot")
	port := strconv.Itoa(freePort(t))
	mustCtl(t, relays[0], "ports", "add", port, "robot/redis")
	for _, host := range hosts {
		Eventually(t, 10*time.Second, func() error {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, redisCLI, "-h", host, "-p", port, "PING").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "PONG" {
				return fmt.Errorf("redis-cli -h %s -p %s PING: %q, %v", host, port, out, err)
			}
			return nil
		})
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestPortInUseOnOneRelay: a mapped port in use on one relay's host stays
// closed there alone, and that relay says so in a fleet event; the other
// relay serves it.
func TestPortInUseOnOneRelay(t *testing.T) {
	relays, hosts := portFleet(t)
	holder, _ := HolderFor(t, relays, "robot")
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "echo=tcp://"+echoService(t)))
	holder.WaitDevice(t, "robot")
	taken, err := net.Listen("tcp", net.JoinHostPort(hosts[1], "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	mustCtl(t, relays[0], "ports", "add", port, "robot/echo")
	Eventually(t, 10*time.Second, func() error {
		got, err := echoPort(net.JoinHostPort(hosts[0], port), "hi")
		if err == nil && got != "hi" {
			err = fmt.Errorf("echoed %q", got)
		}
		return err
	})
	c := &control.Client{BaseURL: relays[0].AdminURL, Token: relays[0].AdminToken}
	Eventually(t, 10*time.Second, func() error {
		events, err := c.Events(t.Context(), 100)
		if err != nil {
			return err
		}
		for _, e := range events {
			if e.Type == node.EventPortsFailed && e.RelayID == relays[1].Node.Fleet().ID() && strings.Contains(e.Message, "tcp port "+port+" for robot/echo") {
				return nil
			}
		}
		return fmt.Errorf("no %s event of relay 2 for port %s in %d events", node.EventPortsFailed, port, len(events))
	})
}
