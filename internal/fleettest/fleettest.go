// Package fleettest starts relays, agents and backends in one process on
// loopback ports for integration tests and benchmarks: real listeners, real
// HTTP clients, a real embedded NATS.
package fleettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/limit"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// testLiveness keeps the tunnels' default ping interval but waits longer for
// answers than the defaults, so that a test machine loaded by the race
// detector does not drop tunnels; the timing itself is tested in virtual time
// (internal/tunnel/livenesstest).
var testLiveness = tunnel.Liveness{Interval: 400 * time.Millisecond, Timeout: 5 * time.Second}

// Relay is a relay node started for a test.
type Relay struct {
	Node       *node.Node
	URL        string // public base URL, http://127.0.0.1:port
	AdminURL   string // admin base URL
	AdminToken string
}

// StartRelay starts a relay on loopback ports with a fresh data dir and
// stops it when the test ends. Options adjust the config before start.
func StartRelay(t testing.TB, opts ...func(*node.Config)) *Relay {
	t.Helper()
	cfg := node.Config{
		Listen:      "127.0.0.1:0",
		AdminListen: "127.0.0.1:0",
		DataDir:     t.TempDir(),
		Liveness:    testLiveness,
		// Tests send many bad credentials from one address on purpose;
		// those that test the back-off set their own.
		AuthBackoff: limit.Config{FreeFailures: 1000},
	}
	for _, o := range opts {
		o(&cfg)
	}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start relay: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, "admin.token"))
	if err != nil {
		t.Fatalf("read admin token: %v", err)
	}
	return &Relay{
		Node:       n,
		URL:        "http://" + n.Addr(),
		AdminURL:   "http://" + n.AdminAddr(),
		AdminToken: strings.TrimSpace(string(tok)),
	}
}

// FastFleet shortens a relay's heartbeat and lease timings so that fleet
// tests see beats, staleness and lease moves within a second or two.
func FastFleet(c *node.Config) {
	c.Fleet.BeatInterval = 100 * time.Millisecond
	c.Fleet.FreshAfter = time.Second
	c.Fleet.LeaseTTL = 600 * time.Millisecond
}

// StartFleet starts n relays sharing one NATS server of the test's own,
// listening on loopback, so that any relay may be stopped. Options apply to
// every relay, after FastFleet.
func StartFleet(t testing.TB, n int, opts ...func(*node.Config)) []*Relay {
	t.Helper()
	st, err := store.Open(context.Background(), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start the fleet's NATS: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	join := func(c *node.Config) { c.NATS = []string{st.ClientURL()} }
	var relays []*Relay
	for range n {
		relays = append(relays, StartRelay(t, append([]func(*node.Config){FastFleet, join}, opts...)...))
	}
	return relays
}

// HolderFor waits until every relay of the fleet sees all of them fresh,
// then returns the relay the ranking picks for device (where its agents
// stay rather than being sent on) and the others.
func HolderFor(t testing.TB, relays []*Relay, device string) (holder *Relay, others []*Relay) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		for _, r := range relays {
			n := 0
			for _, rs := range r.Node.Fleet().Relays() {
				if rs.Fresh {
					n++
				}
			}
			if n != len(relays) {
				return fmt.Errorf("a relay sees %d fresh relays of %d", n, len(relays))
			}
		}
		return nil
	})
	target, ok := relays[0].Node.Fleet().Holder(device, "", nil, "")
	if !ok {
		t.Fatalf("no relay can hold %s", device)
	}
	for _, r := range relays {
		if r.Node.Fleet().ID() == target.ID {
			holder = r
		} else {
			others = append(others, r)
		}
	}
	return holder, others
}

// FleetToken creates a token on the first relay and waits until every
// relay knows it.
func FleetToken(t testing.TB, relays []*Relay, kind auth.Kind, name string, devices ...string) string {
	t.Helper()
	tok := relays[0].Token(t, kind, name, devices...)
	Eventually(t, 5*time.Second, func() error {
		for _, r := range relays {
			if _, err := r.Node.Tokens().Authenticate(tok); err != nil {
				return err
			}
		}
		return nil
	})
	return tok
}

// Token creates a token of kind for devices and returns its secret.
func (r *Relay) Token(t testing.TB, kind auth.Kind, name string, devices ...string) string {
	t.Helper()
	secret, _, err := r.Node.Tokens().Create(context.Background(), auth.CreateRequest{Kind: kind, Name: name, Devices: devices})
	if err != nil {
		t.Fatalf("create %s token: %v", kind, err)
	}
	return secret
}

// WaitDevice waits until an agent for device is connected to the relay.
func (r *Relay) WaitDevice(t testing.TB, device string) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		if slices.Contains(r.Node.Devices(), device) {
			return nil
		}
		return errors.New("device " + device + " has no agent connected yet")
	})
}

// Agent is an agent started for a test.
type Agent struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // what Run returned; read after done
}

// StartAgent runs an agent for device in front of backend against relay,
// and stops it when the test ends. Options adjust the config.
func StartAgent(t testing.TB, relay *Relay, device, backend, token string, opts ...func(*agent.Config)) *Agent {
	t.Helper()
	cfg := agent.Config{
		Liveness:     testLiveness,
		Relays:       []*url.URL{mustParse(t, relay.URL)},
		Device:       device,
		Backend:      mustParse(t, backend),
		Token:        token,
		PreserveHost: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("new agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ag := &Agent{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ag.done)
		ag.err = a.Run(ctx)
	}()
	t.Cleanup(func() { ag.Stop() })
	return ag
}

// Stop stops the agent and returns what Run returned.
func (a *Agent) Stop() error {
	a.cancel()
	<-a.done
	return a.err
}

// Done is closed when the agent has stopped, by itself or by Stop.
func (a *Agent) Done() <-chan struct{} { return a.done }

// Err returns what the agent's Run returned; call it after Done is closed.
func (a *Agent) Err() error { return a.err }

// Eventually calls f until it returns nil, failing the test with f's last
// error when timeout passes. It polls; it never sleeps blind.
var Eventually = testkit.Eventually

func mustParse(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return u
}

// errNotYet is what a polled condition returns while it does not hold yet.
var errNotYet = errors.New("not yet")

// NewClient returns an HTTP client of the test's own whose idle connections
// are closed when the test ends, so that none outlives it.
func NewClient(t testing.TB, keepAlive bool) *http.Client {
	tr := &http.Transport{DisableKeepAlives: !keepAlive}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// Status GETs url and returns the status, or 0 and the error when no HTTP
// answer came.
func Status(c *http.Client, url string) (int, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
