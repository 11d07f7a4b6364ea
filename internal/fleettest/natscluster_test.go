package fleettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/natscluster"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// natsServer returns a nats-server binary: SWITCHBOARD_NATS_SERVER, or one
// built once from the module's own dependency.
var natsServer = sync.OnceValues(func() (string, error) {
	if p := os.Getenv("SWITCHBOARD_NATS_SERVER"); p != "" {
		return p, nil
	}
	dir, err := os.MkdirTemp("", "nats-server")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nats-server")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build nats-server: %v\n%s", err, out)
	}
	return bin, nil
})

// TestFleetOnANATSCluster runs three relays on a real three-node NATS
// cluster (JetStream, every bucket and stream kept three times) under a
// steady load for known devices, some of it forwarded, and loses NATS nodes
// one at a time: with one node killed nothing fails and the operator's
// commands work; with two killed (no quorum) nothing fails either, and the
// operator's commands fail at once with a message that says NATS is away;
// when the nodes return everything converges and the commands work again.
// The fleet runs without hot standby, where a device's agent that moved is
// found by routing alone, and with it.
func TestFleetOnANATSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a NATS cluster of three processes")
	}
	bin, err := natsServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("without-standby", func(t *testing.T) { fleetOnANATSCluster(t, bin, false) })
	t.Run("hot-standby", func(t *testing.T) { fleetOnANATSCluster(t, bin, true) })
}

// fleetOnANATSCluster is TestFleetOnANATSCluster on a cluster of its own
// started from the nats-server binary bin, with hot standby or without.
func fleetOnANATSCluster(t *testing.T, bin string, standby bool) {
	ctx := context.Background()
	cluster, err := natscluster.Start(ctx, bin, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	onCluster := func(c *node.Config) { c.NATS, c.NATSReplicas, c.HotStandby = cluster.URLs(), 3, standby }
	var relays []*Relay
	for i := range 3 {
		// What each relay logged ends a failure's report: a request that
		// failed while the cluster healed is told by what the relays did.
		logs := &testkit.Buffer{}
		logged := func(c *node.Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) }
		relays = append(relays, StartRelay(t, FastFleet, onCluster, logged))
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("relay %d (%s), its last log lines:\n%s", i, relays[i].Node.Fleet().ID(), logs.Tail(60))
			}
		})
	}
	backend := newBackend(t, "cluster").URL
	var devices []string
	for i := range 6 {
		d := fmt.Sprintf("cluster-dev-%d", i)
		tok := FleetToken(t, relays, auth.KindAgent, "agent", d)
		StartAgent(t, relays[i%3], d, backend, tok)
		devices = append(devices, d)
	}
	user := FleetToken(t, relays, auth.KindUser, "user")
	waitConverged(t, relays, len(devices))

	load := startClusterLoad(t, relays, devices, user)
	admin := &control.Client{BaseURL: relays[0].AdminURL, Token: relays[0].AdminToken}

	// One node of three killed: the others keep the quorum. A stream whose
	// leader it was answers again once the two have elected another (a 503
	// that says to try again until then).
	load.phase.Store("one node down")
	cluster.Kill(0)
	killed := time.Now()
	load.waitFor(t, 300)
	Eventually(t, 20*time.Second, func() error {
		_, err := admin.CreateToken(ctx, control.TokenRequest{Kind: auth.KindUser, Name: "with two of three"})
		return err
	})
	t.Logf("with two of three NATS nodes, a token create succeeded %s after the kill", time.Since(killed).Round(time.Millisecond))
	load.phase.Store("one node down, drain and undrain")
	for _, drain := range []bool{true, false} {
		Eventually(t, 20*time.Second, func() error {
			_, err := admin.SetRelayDraining(ctx, relays[2].Node.Fleet().ID(), drain)
			var apiErr *control.APIError
			if errors.As(err, &apiErr) && apiErr.Status != http.StatusServiceUnavailable {
				t.Fatalf("drain %v with two of three NATS nodes: %v; want it done, or a 503 while NATS elects a leader", drain, err)
			}
			return err
		})
	}
	t.Logf("with two of three NATS nodes, drain and undrain done %s after the kill", time.Since(killed).Round(time.Millisecond))

	// Two killed: the survivor takes connections but no writes.
	load.phase.Store("two nodes down")
	cluster.Kill(1)
	Eventually(t, 30*time.Second, func() error {
		for _, r := range relays {
			if age := r.Node.Fleet().Status().ViewAgeMS; age < 3000 {
				return fmt.Errorf("relay %s's view is %d ms old, want it frozen past three fresh windows", r.Node.Fleet().ID(), age)
			}
		}
		return nil
	})
	load.waitFor(t, 300)
	began := time.Now()
	_, err = admin.CreateToken(ctx, control.TokenRequest{Kind: auth.KindUser, Name: "with one of three"})
	var apiErr *control.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable || !strings.Contains(strings.ToLower(apiErr.Message), "nats") {
		t.Fatalf("creating a token with one of three NATS nodes: %v, want a 503 that names NATS", err)
	}
	if took := time.Since(began); took > 15*time.Second {
		t.Errorf("the refused token create took %s", took)
	}
	t.Logf("with one of three NATS nodes, a token create answered in %s: %v", time.Since(began).Round(time.Millisecond), err)
	began = time.Now()
	_, err = admin.SetRelayDraining(ctx, relays[2].Node.Fleet().ID(), true)
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable || !strings.Contains(strings.ToLower(apiErr.Message), "nats") {
		t.Fatalf("draining a relay with one of three NATS nodes: %v, want a 503 that names NATS", err)
	}
	t.Logf("with one of three NATS nodes, a drain answered in %s: %v", time.Since(began).Round(time.Millisecond), err)

	// Both back: the cluster heals, the relays catch up, commands work.
	load.phase.Store("nodes back")
	for _, i := range []int{0, 1} {
		if err := cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	back := time.Now()
	if err := cluster.Ready(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, relays, len(devices))
	Eventually(t, 30*time.Second, func() error {
		_, err := admin.CreateToken(ctx, control.TokenRequest{Kind: auth.KindUser, Name: "after the cluster healed"})
		return err
	})
	t.Logf("converged %s after the two nodes restarted", time.Since(back).Round(time.Millisecond))
	load.waitFor(t, 300)
	total, failed := load.stop()
	if len(failed) > 0 {
		t.Fatalf("%d of %d requests for known devices failed, first: %s", len(failed), total, failed[0])
	}
	t.Logf("%d requests for known devices, none failed", total)
}

// waitConverged waits until every relay reaches NATS, sees the three relays
// fresh and every device online, with a current view.
func waitConverged(t *testing.T, relays []*Relay, devices int) {
	t.Helper()
	Eventually(t, 60*time.Second, func() error {
		for _, r := range relays {
			st := r.Node.Fleet().Status()
			if !st.NATSConnected || st.FreshRelays != len(relays) || st.OnlineDevices != devices || st.ViewAgeMS > 1000 {
				return fmt.Errorf("relay %s: nats %v, %d fresh relays, %d devices online, view %d ms old",
					st.RelayID, st.NATSConnected, st.FreshRelays, st.OnlineDevices, st.ViewAgeMS)
			}
		}
		return nil
	})
}

// clusterLoad sends GETs for every device through every relay in turn, as a
// balancer would (two in three need a forward hop), until stopped.
type clusterLoad struct {
	cancel context.CancelFunc
	done   chan struct{}
	sent   atomic.Int64
	phase  atomic.Value // string: what the test is doing, for the failures' messages

	mu     sync.Mutex // guards failed
	failed []string
}

func startClusterLoad(t *testing.T, relays []*Relay, devices []string, user string) *clusterLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &clusterLoad{cancel: cancel, done: make(chan struct{})}
	l.phase.Store("healthy")
	c := NewClient(t, true)
	go func() {
		defer close(l.done)
		for i := 0; ctx.Err() == nil; i++ {
			r, d := relays[i%len(relays)], devices[(i/len(relays))%len(devices)]
			if err := getDevice(ctx, c, r.URL+"/client/"+d+"/echo/ping", user); err != nil && ctx.Err() == nil {
				l.mu.Lock()
				l.failed = append(l.failed, fmt.Sprintf("%s via %s (%s): %v", d, r.Node.Fleet().ID(), l.phase.Load(), err))
				l.mu.Unlock()
			}
			l.sent.Add(1)
		}
	}()
	t.Cleanup(func() { l.stop() })
	return l
}

// waitFor waits until n more requests have been sent.
func (l *clusterLoad) waitFor(t *testing.T, n int64) {
	t.Helper()
	target := l.sent.Load() + n
	Eventually(t, 60*time.Second, func() error {
		if got := l.sent.Load(); got < target {
			return fmt.Errorf("%d of %d requests sent", got, target)
		}
		return nil
	})
}

// stop ends the load and returns how many requests it sent and those that
// failed.
func (l *clusterLoad) stop() (int64, []string) {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent.Load(), l.failed
}

func getDevice(ctx context.Context, c *http.Client, url, user string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+user)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
