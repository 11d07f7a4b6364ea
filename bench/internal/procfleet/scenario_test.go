package procfleet_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// bin is the switchboard binary, built (or found up to date) by TestMain.
var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if !testing.Short() {
		var err error
		if bin, err = benchkit.SharedBinary(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// startFleet starts relays of cfg with a backend and, per name in
// devices, an agent of protocol proto knowing every relay, first a
// different one; it waits until every device is online. Everything stops
// when the test ends; the relays' logs are shown when it failed.
func startFleet(t *testing.T, ctx context.Context, cfg procfleet.Config, proto func(i int) string, devices []string, agentLog io.Writer) *procfleet.Fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("starts relay processes")
	}
	cfg.Bin, cfg.Dir = bin, t.TempDir()
	f, err := procfleet.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(f.Logs(30))
		}
		f.Close()
	})
	backend, err := procfleet.StartBackend()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(backend.Close)
	agents := procfleet.NewAgents(ctx)
	t.Cleanup(agents.Stop) // before the backend and the relays close
	for i, d := range devices {
		if err := agents.Start(agent.Config{Relays: procfleet.Rotate(f.Entries(), i), Device: d, Backend: backend.URL(), Protocol: proto(i),
			Logger: slog.New(slog.NewTextHandler(agentLog, &slog.HandlerOptions{Level: slog.LevelDebug})).With("agent", d)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.WaitOnline(ctx, devices); err != nil {
		t.Fatal(err)
	}
	return f
}

// names returns n device names.
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// backWithin bounds the time every device of a lost relay takes to answer
// again through a survivor: generous, as this is a test of correctness
// on a shared machine, not a measurement (bench/failover measures).
const backWithin = 10 * time.Second

// TestFailoverKillThenFreeze kills (-9) the relay holding the most of 60
// devices under a load of GETs and POSTs, then freezes (SIGSTOP) the
// fuller survivor: after each, every device the lost relay held answers
// again through the relays left within backWithin, and no GET sent through
// a relay that stayed up fails.
func TestFailoverKillThenFreeze(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	devices := names("dev", 60)
	agentLog := &testkit.Buffer{}
	// The relays probe each other faster than by default, so that a
	// survivor vetoes the frozen relay (within about 0.4 s) before the
	// agents give it up as silent (1.2 s). With the defaults (a veto after
	// 0.8 s or more) an agent may be sent back to the frozen relay by a
	// survivor that still ranks it first, and its dial there waits out
	// 15 s: a delay this test would report, not the failover it checks.
	cfg := procfleet.Config{Relays: 3, LogLevel: "info", Args: []string{"--probe-interval", "100ms", "--probe-timeout", "200ms"}}
	f := startFleet(t, ctx, cfg, func(int) string { return agent.ProtocolNative }, devices, agentLog)
	load := procfleet.StartLoad(ctx, f.Relays(), devices, 5*time.Millisecond)
	defer load.Stop()

	var left []*procfleet.Relay
	for _, step := range []struct {
		name string
		lose func(*procfleet.Relay) error
	}{
		{"kill", (*procfleet.Relay).Kill},
		{"freeze", (*procfleet.Relay).Freeze},
	} {
		dir, err := f.Online(ctx)
		if err != nil {
			t.Fatal(err)
		}
		load.SetHolders(dir)
		victim, held := f.Fullest(dir, upRelays(f)...)
		left = nil
		for _, r := range upRelays(f) {
			if r != victim {
				left = append(left, r)
			}
		}
		start := time.Now()
		if err := step.lose(victim); err != nil {
			t.Fatal(err)
		}
		if step.name == "freeze" {
			t.Cleanup(func() { victim.Thaw() }) // so that Close's SIGKILL finds it at once
		}
		slowest, lost := firstAnswers(ctx, left, held, start)
		t.Logf("%s relay %d with %d devices: every device back within %s; load so far: %s", step.name, victim.N, len(held), slowest.Round(time.Millisecond), load.Summary())
		if len(lost) > 0 {
			t.Errorf("%s: %d of %d devices did not answer again within %s: %v", step.name, len(lost), len(held), backWithin, lost)
			for line := range strings.Lines(agentLog.String()) {
				for _, d := range lost {
					if strings.Contains(line, "agent="+d) {
						t.Logf("agent: %s", strings.TrimSpace(line))
					}
				}
			}
		}
		if err := f.WaitOnline(ctx, devices); err != nil {
			t.Fatalf("after the %s: %v", step.name, err)
		}
	}
	if n, first := load.FailedThroughSurvivors(false); n > 0 {
		t.Errorf("%d GETs failed through relays that stayed up (first: %s); load: %s", n, first, load.Summary())
	}
	if a, _ := load.Counts(); a < 50 {
		t.Errorf("the load sent %d requests: too few to tell", a)
	}
}

// upRelays returns the fleet's relays that are up.
func upRelays(f *procfleet.Fleet) []*procfleet.Relay {
	var out []*procfleet.Relay
	for _, r := range f.Relays() {
		if r.Up() {
			out = append(out, r)
		}
	}
	return out
}

// firstAnswers probes every device through the relays in turn until it
// answers 200, and returns the longest time since start it took and the
// devices that did not answer within backWithin.
func firstAnswers(ctx context.Context, relays []*procfleet.Relay, devices []string, start time.Time) (time.Duration, []string) {
	times := make([]time.Duration, len(devices))
	var wg sync.WaitGroup
	for i, d := range devices {
		wg.Go(func() {
			times[i] = benchkit.FirstOK(ctx, func(k int) string { return relays[k%len(relays)].URL() + "/client/" + d + "/" },
				start, backWithin, 20*time.Millisecond, time.Second)
		})
	}
	wg.Wait()
	var slowest time.Duration
	var lost []string
	for i, t := range times {
		if t < 0 {
			lost = append(lost, devices[i])
		}
		slowest = max(slowest, t)
	}
	return slowest, lost
}

// TestRollUnderLoad rolls a fleet of three relays with the real
// `switchboard ctl roll`, native and long-poll agents attached and a light
// load of GETs and POSTs going to the relays that are up: every relay
// comes back reporting the new version, and no request fails.
func TestRollUnderLoad(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	devices := append(names("n", 8), names("lp", 2)...)
	proto := func(i int) string {
		if i >= 8 {
			return agent.ProtocolLongPoll
		}
		return agent.ProtocolNative
	}
	f := startFleet(t, ctx, procfleet.Config{Relays: 3, Version: "v1", Args: []string{"--drain-spread", "500ms"}}, proto, devices, io.Discard)
	load := procfleet.StartLoad(ctx, f.Relays(), devices, 10*time.Millisecond)
	defer load.Stop()
	if dir, err := f.Online(ctx); err == nil {
		load.SetHolders(dir)
	}
	if _, err := f.Ctl(ctx, nil, "roll", "enable"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	out, err := f.Roll(ctx, "v2", testWriter{t})
	t.Logf("roll took %s:\n%s", time.Since(began).Round(100*time.Millisecond), out)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WaitOnline(ctx, devices); err != nil {
		t.Fatal(err)
	}
	rs, err := f.API(nil).ListRelays(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Version != "v2" {
			t.Errorf("relay %s reports version %q after the roll: want v2", r.ID, r.Version)
		}
	}
	load.Stop()
	attempted, failed := load.Counts()
	t.Logf("load: %s", load.Summary())
	if failed > 0 || attempted < 100 {
		_, firstGET := load.FailedThroughSurvivors(false)
		_, firstPOST := load.FailedThroughSurvivors(true)
		t.Errorf("%d of %d requests failed during the roll (first GET: %q, first POST: %q)", failed, attempted, firstGET, firstPOST)
	}
}

// testWriter writes to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}
