// Command frontdoor measures a Switchboard fleet behind a real front door
// that hashes on the device: Debian's nginx configured as docs/deploy.md's
// ingress-nginx snippet hashes, and HAProxy with
// deploy/bare-metal/haproxy.cfg as shipped (only its addresses filled in).
// Three `switchboard serve` processes on 127.0.0.11–13 share one NATS
// server hosted by this process; native and long-poll agents in this
// process know only the front door's URL, as in a real deployment; users'
// requests go through the front door too. It reports the share of users'
// requests that needed a forward hop (from the relays'
// switchboard_router_forwards_total), then kills -9 the relay holding the most
// devices and reports, per device it held, the time until requests through
// the front door succeed again, and the failed requests of the load.
//
//	go run ./bench/frontdoor -md results.md
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
)

func main() {
	var c config
	flag.StringVar(&c.frontDoors, "frontdoors", "nginx,haproxy", "front doors to measure, in turn")
	flag.IntVar(&c.o.native, "native", 200, "devices with a native agent")
	flag.IntVar(&c.o.longpoll, "longpoll", 20, "devices with a long-poll agent")
	flag.BoolVar(&c.o.keepArriving, "keep-arriving", true, "run the relays with --keep-arriving-agents")
	flag.IntVar(&c.rate, "rate", 100, "users' requests per second through the front door")
	flag.DurationVar(&c.steady, "steady", 20*time.Second, "how long the forward share is measured")
	flag.IntVar(&c.trials, "trials", 3, "kill -9 trials per front door")
	flag.BoolVar(&c.drain, "drain", true, "then drain a relay behind HAProxy, which follows /readyz")
	flag.StringVar(&c.bin, "bin", "", "switchboard binary (default: build one)")
	flag.StringVar(&c.md, "md", "", "also write the results as Markdown to this file")
	flag.Parse()
	out, err := run(context.Background(), c)
	fmt.Print(out)
	if c.md != "" && out != "" {
		if werr := os.WriteFile(c.md, []byte(out), 0o644); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

// config is one run's settings.
type config struct {
	frontDoors string
	o          options
	rate       int
	steady     time.Duration
	trials     int
	drain      bool
	bin, md    string
}

func run(ctx context.Context, c config) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "switchboard-frontdoor-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	bin, err := benchkit.Binary(c.bin, dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d native and %d long-poll devices, 3 relays (--keep-arriving-agents=%v), %d users' requests/s through the front door (half by path, half by X-Server-Name), forward share over %s; %d kill -9 trials.\n\n",
		c.o.native, c.o.longpoll, c.o.keepArriving, c.rate, c.steady, c.trials)
	fmt.Fprintf(&b, "| front door | forward share | kill -9: devices | back p50 | back p99 | max | not back in %s | failed requests / sent | forward share after the relay is back (all trials) |\n|---|---|---|---|---|---|---|---|---|\n", backWithin)
	load := loadAvg()
	var drains []string
	for _, kind := range strings.Split(c.frontDoors, ",") {
		row, drain, err := measureOne(ctx, bin, root, filepath.Join(dir, kind), kind, c)
		if err != nil {
			return b.String(), fmt.Errorf("%s: %w", kind, err)
		}
		b.WriteString(row)
		if drain != "" {
			drains = append(drains, drain)
		}
	}
	if len(drains) > 0 {
		b.WriteString("\n" + strings.Join(drains, ""))
	}
	fmt.Fprintf(&b, "\nLoad average (1 min) at the start %s, at the end %s.\n", load, loadAvg())
	return b.String(), nil
}

// loadAvg is the machine's one-minute load average, from /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// measureOne starts a fleet behind one front door and measures it: its
// row of the table, and the line of its drain trial if it had one.
func measureOne(ctx context.Context, bin, root, dir, kind string, c config) (row, drain string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, kind+": "+format+"\n", args...) }
	s, err := startSetup(ctx, bin, root, dir, kind, c.o)
	if err != nil {
		return "", "", err
	}
	defer s.close()
	logf("%d devices online behind %s", len(s.devices), s.front.url)
	before := steady(ctx, s, c.rate, c.steady)
	logf("steady: %d requests, %.0f forwards (%.1f %%), %d failed %s", before.sent, before.forwards, 100*before.share(), before.failed, before.firstErr)
	var back []time.Duration
	var affected, lost int
	var failed, sent int64
	var after loadResult
	for i := range c.trials {
		t, victim, err := killTrial(ctx, s, c.rate, loadAfterKill)
		if err != nil {
			return "", "", fmt.Errorf("trial %d: %w", i+1, err)
		}
		if err := s.restart(ctx, victim); err != nil {
			return "", "", fmt.Errorf("trial %d: restart relay %d: %w", i+1, victim.N, err)
		}
		back = append(back, t.back...)
		affected += t.affected
		lost += t.lost
		failed += t.load.failed
		sent += t.load.sent
		logf("trial %d: relay %d with %d devices killed: back p50 %s, p99 %s, max %s; %d not back %v; %d of %d requests failed %s",
			i+1, t.relay, t.affected, pct(t.back, 50), pct(t.back, 99), pct(t.back, 100), t.lost, t.lostOnes, t.load.failed, t.load.sent, t.load.firstErr)
		a := steady(ctx, s, c.rate, c.steady/2)
		logf("after relay %d is back: %d requests, %.0f forwards (%.1f %%), %d failed", t.relay, a.sent, a.forwards, 100*a.share(), a.failed)
		after.sent, after.forwards, after.failed = after.sent+a.sent, after.forwards+a.forwards, after.failed+a.failed
	}
	if kind == kindHAProxy && c.drain {
		// nginx (without the commercial active checks) does not follow
		// /readyz, so only HAProxy takes a drained relay out of its hash.
		d, err := drainTrial(ctx, s, c.rate)
		if err != nil {
			return "", "", fmt.Errorf("drain: %w", err)
		}
		logf("drain of relay %d with %d devices: all moved in %s (%d left); %d of %d requests failed %s; forward share %.1f %%",
			d.relay, d.devices, d.took.Round(time.Millisecond), d.left, d.load.failed, d.load.sent, d.load.firstErr, 100*d.load.share())
		drain = fmt.Sprintf("- %s, `ctl relays drain` of relay %d with %d devices under the load: all moved in **%s** (%d left), failed requests **%d** of %d, %.1f %% forwarded meanwhile.\n",
			kind, d.relay, d.devices, d.took.Round(100*time.Millisecond), d.left, d.load.failed, d.load.sent, 100*d.load.share())
	}
	row = fmt.Sprintf("| %s | **%.1f %%** (%.0f of %d) | %d | **%s** | **%s** | %s | %d | %d / %d | %.1f %% (%.0f of %d) |\n",
		kind, 100*before.share(), before.forwards, before.sent, affected,
		ms(pct(back, 50)), ms(pct(back, 99)), ms(pct(back, 100)), lost, failed, sent, 100*after.share(), after.forwards, after.sent)
	return row, drain, nil
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

// moduleRoot finds the Switchboard module's directory from the working
// directory up.
func moduleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/switchboard-relay/switchboard\n") {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", errors.New("run from within the switchboard module")
		}
		d = up
	}
}
