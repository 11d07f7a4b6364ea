// Command drainmany drains a relay that holds many idle native agents and
// measures how long they take to move to another relay, and whether any
// request fails meanwhile. Two `switchboard serve` processes share one NATS
// server hosted by this process; the agents (real Switchboard agents, one
// per device) and their backend run in this process and all start on the
// first relay.
//
//	go run ./bench/drainmany -agents 10000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-agent-worker" {
		if err := agentWorker(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	n := flag.Int("agents", 10000, "idle native agents, one per device")
	workers := flag.Int("workers", 4, "processes the agents run in (each has its own open-file limit)")
	bin := flag.String("bin", "", "switchboard binary (default: build one)")
	spread := flag.Duration("spread", 5*time.Second, "the drained relay's --drain-spread")
	md := flag.String("md", "", "also write the result as Markdown to this file")
	ping := flag.Duration("ping", 400*time.Millisecond, "the relays' tunnel ping interval")
	pingTimeout := flag.Duration("ping-timeout", 800*time.Millisecond, "the relays' tunnel ping timeout")
	flag.StringVar(&logLevel, "log-level", "error", "the relays' --log-level (their output goes to stderr)")
	flag.StringVar(&profileDir, "profile-dir", "", "write 5 s CPU profiles of both relays and of the agents' processes, taken as the drain begins, to this directory")
	flag.DurationVar(&agentPing, "agent-ping", 0, "the agents' own ping interval, timeout half of it (0: the agent's default, 10 s while it keeps a standby); -ping stays the relays'")
	flag.BoolVar(&hotStandby, "hot-standby", false, "run the relays with --hot-standby, so that agents keep standby tunnels and the drain promotes them")
	flag.IntVar(&loadRate, "rate", 0, "the load's requests a second, over its 8 clients (0: each client sends its next request as soon as the last is answered, which takes whatever CPU the relays leave)")
	flag.DurationVar(&standbyWait, "standby-wait", time.Minute, "wait up to this long, before the drain, until the directory records every agent's standby tunnel at the other relay (0: do not wait)")
	flag.Parse()
	live = tunnel.Liveness{Interval: *ping, Timeout: *pingTimeout}
	if err := run(*n, *workers, *bin, *spread, *md); err != nil {
		log.Fatal(err)
	}
}

// logLevel is -log-level.
var logLevel string

// profileDir, when set, receives the relays' CPU profiles of the drain.
var profileDir string

// hotStandby is -hot-standby.
var hotStandby bool

// standbyWait is -standby-wait.
var standbyWait time.Duration

// loadRate is -rate.
var loadRate int

// agentPing is -agent-ping.
var agentPing time.Duration

// live is the relays' tunnel liveness.
var live tunnel.Liveness

func run(n, workers int, bin string, spread time.Duration, md string) error {
	dir, err := os.MkdirTemp("", "switchboard-drainmany-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin, err = benchkit.Binary(bin, dir); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := procfleet.Start(ctx, procfleet.Config{Bin: bin, Dir: dir, Relays: 2, Output: os.Stderr, LogLevel: logLevel,
		Args: append([]string{"--max-forward", fmt.Sprint(2 * n), "--drain-spread", spread.String(),
			"--tunnel-ping-interval", live.Interval.String(), "--tunnel-ping-timeout", live.Timeout.String()}, hotStandbyArgs()...)})
	if err != nil {
		return err
	}
	defer f.Close()
	relays := f.Relays()
	// The second relay joins only after the agents are placed: all of them
	// start on the first (with the second out of the way, drained).
	api := f.APIOf(relays[0])
	id0, id1 := relays[0].ID, relays[1].ID
	if _, err := api.SetRelayDraining(ctx, id1, true); err != nil {
		return err
	}

	first, _ := url.Parse(relays[0].URL())
	second, _ := url.Parse(relays[1].URL())
	devices := make([]string, n)
	for i := range n {
		devices[i] = fmt.Sprintf("idle-%05d", i)
	}
	// The agents run in worker processes of this binary, each with its own
	// backend: one process could not hold the file descriptors of 10,000
	// agents while they move.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	per := (n + workers - 1) / workers
	if profileDir != "" {
		os.Setenv(workerProfileEnv, profileDir) // the workers profile themselves on SIGUSR1
	}
	var procs []*procfleet.Proc
	for w := range workers {
		lo, hi := w*per, min(n, (w+1)*per)
		if lo >= hi {
			break
		}
		p, err := procfleet.StartProc(fmt.Sprintf("agent worker %d", w), self,
			[]string{"-agent-worker", first.String(), second.String(), fmt.Sprint(lo), fmt.Sprint(hi), agentPing.String()}, os.Stderr)
		if err != nil {
			return err
		}
		defer p.Kill()
		procs = append(procs, p)
	}
	count := func(id string) (int, error) {
		rs, err := api.ListRelays(ctx)
		if err != nil {
			return 0, err
		}
		for _, r := range rs {
			if r.ID == id {
				return r.AttachedDevices, nil
			}
		}
		return 0, nil
	}
	if err := benchkit.Poll(ctx, 5*time.Minute, 50*time.Millisecond, func() error {
		k, err := count(id0)
		if err == nil && k < n {
			err = fmt.Errorf("%d of %d agents on the first relay", k, n)
		}
		return err
	}); err != nil {
		return err
	}
	if _, err := api.SetRelayDraining(ctx, id1, false); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%d agents on the first relay\n", n)

	// Load: small GETs for random devices through either relay.
	var attempted, failed atomic.Int64
	var firstErr atomic.Value
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	const clients = 8
	for w := range clients {
		wg.Go(func() {
			var pace <-chan time.Time
			if loadRate > 0 {
				t := time.NewTicker(time.Second * clients / time.Duration(loadRate))
				defer t.Stop()
				pace = t.C
			}
			for i := w; lctx.Err() == nil; i += clients {
				if pace != nil {
					select {
					case <-pace:
					case <-lctx.Done():
						return
					}
				}
				base := []string{first.String(), second.String()}[i%2]
				attempted.Add(1)
				resp, err := c.Get(base + "/client/" + devices[(i*7919)%n] + "/")
				if err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
					}
				}
				if err != nil && lctx.Err() == nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	metrics := []string{relays[0].AdminURL() + "/metrics", relays[1].AdminURL() + "/metrics"}
	for range 4 {
		<-time.After(500 * time.Millisecond)
		fmt.Fprintf(os.Stderr, "before the drain: tunnels %v on the first relay, %v on the other; %d failed requests\n",
			benchkit.Gauge(metrics[0], "switchboard_tunnel_sessions"), benchkit.Gauge(metrics[1], "switchboard_tunnel_sessions"), failed.Load())
	}
	if hotStandby && standbyWait > 0 {
		// Agents that keep standbys are named the other relay once it is
		// undrained, and open them there: wait until the directory records
		// every one, so that the drain asks them all to promote.
		start := time.Now()
		recorded := 0
		err := benchkit.Poll(ctx, standbyWait, 500*time.Millisecond, func() error {
			ds, err := api.ListDevices(ctx)
			if err != nil {
				return err
			}
			recorded = 0
			for _, d := range ds {
				if d.RelayID == id0 && d.Standby == id1 {
					recorded++
				}
			}
			if recorded < n {
				return fmt.Errorf("%d of %d standbys recorded", recorded, n)
			}
			return nil
		})
		fmt.Fprintf(os.Stderr, "standbys: %v tunnels on the other relay, %d of %d recorded, after %v (%v)\n",
			benchkit.Gauge(metrics[1], "switchboard_tunnel_standby_sessions"), recorded, n, time.Since(start).Round(time.Millisecond), err)
	}
	if profileDir != "" {
		for _, p := range procs {
			p.Signal(syscall.SIGUSR1)
		}
		for i, r := range relays {
			wg.Go(func() {
				path := filepath.Join(profileDir, fmt.Sprintf("relay%d.cpu.pprof", i))
				if err := benchkit.SaveProfile(r.AdminURL()+"/debug/pprof/profile?seconds=5", f.Token(), path); err != nil {
					log.Printf("profile: %v", err)
				}
			})
		}
	}
	began := time.Now()
	fmt.Fprintf(os.Stderr, "%s: drain\n", began.Format("15:04:05.0"))
	if _, err := api.SetRelayDraining(ctx, id0, true); err != nil {
		return err
	}
	var took, shown time.Duration
	err = benchkit.Poll(ctx, 2*time.Minute, 50*time.Millisecond, func() error {
		k, err := count(id0)
		if t := time.Since(began); t-shown >= time.Second {
			shown = t.Truncate(time.Second)
			fmt.Fprintf(os.Stderr, "%5.1fs: %d devices still on the drained relay; tunnels %v there, %v on the other; %d failed requests\n",
				t.Seconds(), k, benchkit.Gauge(metrics[0], "switchboard_tunnel_sessions"), benchkit.Gauge(metrics[1], "switchboard_tunnel_sessions"), failed.Load())
		}
		if err == nil && k > 0 {
			err = fmt.Errorf("%d agents still on the drained relay", k)
		}
		took = time.Since(began)
		return err
	})
	stopLoad()
	wg.Wait()
	if err != nil {
		return err
	}
	out := fmt.Sprintf("- **drain of a relay holding %d idle native agents** (spread %s): all moved in **%s**; requests meanwhile: %d, failed **%d**\n",
		n, spread, took.Round(100*time.Millisecond), attempted.Load(), failed.Load())
	if e := firstErr.Load(); e != nil {
		out += fmt.Sprintf("  - first failure: `%v`\n", e)
	}
	fmt.Print(out)
	if md != "" {
		return os.WriteFile(md, []byte(out), 0o644)
	}
	return nil
}

// agentWorker runs the agents of devices [lo, hi) against the two relays,
// with a backend of its own, until it is killed.
func agentWorker(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("usage: -agent-worker FIRST SECOND LO HI AGENT-PING")
	}
	var agentLive tunnel.Liveness // the agent's default
	if p, err := time.ParseDuration(args[4]); err == nil && p > 0 {
		agentLive = tunnel.Liveness{Interval: p, Timeout: p / 2}
	}
	first, _ := url.Parse(args[0])
	second, _ := url.Parse(args[1])
	var lo, hi int
	fmt.Sscan(args[2], &lo)
	fmt.Sscan(args[3], &hi)
	backend, err := procfleet.StartBackend()
	if err != nil {
		return err
	}
	bu := backend.URL()
	ctx := context.Background()
	if dir := os.Getenv(workerProfileEnv); dir != "" {
		go profileOnSignal(filepath.Join(dir, fmt.Sprintf("agents%d.cpu.pprof", lo)))
	}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("DRAINMANY_TRACE") != "" {
		c := &countingHandler{n: map[string]int{}, trail: map[string][]string{}, since: map[string]time.Time{}}
		logger = slog.New(c)
		go c.report(lo)
	}
	for i := lo; i < hi; i++ {
		a, err := agent.New(agent.Config{Relays: []*url.URL{first, second}, Device: fmt.Sprintf("idle-%05d", i), Backend: bu,
			Protocol: agent.ProtocolNative, Liveness: agentLive, Logger: logger})
		if err != nil {
			return err
		}
		go a.Run(ctx)
		if (i-lo)%250 == 249 {
			<-time.After(100 * time.Millisecond) // connect in waves, not all in one instant
		}
	}
	select {}
}

// workerProfileEnv names, to the agent workers, the directory of their CPU
// profiles.
const workerProfileEnv = "DRAINMANY_PROFILE_DIR"

// profileOnSignal writes a 5 s CPU profile of this process to path at
// each SIGUSR1: the agents' side of the drain.
func profileOnSignal(path string) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	for range sig {
		f, err := os.Create(path)
		if err != nil {
			log.Print(err)
			continue
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Print(err)
			f.Close()
			continue
		}
		<-time.After(5 * time.Second)
		pprof.StopCPUProfile()
		f.Close()
	}
}

// countingHandler counts the agents' state changes by message and error,
// for DRAINMANY_TRACE=1.
type countingHandler struct {
	mu    sync.Mutex
	n     map[string]int
	trail map[string][]string // device: its events since it was last connected
	since map[string]time.Time
}

func (c *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (c *countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *countingHandler) WithGroup(string) slog.Handler            { return c }
func (c *countingHandler) Handle(_ context.Context, r slog.Record) error {
	k, dev := r.Message, ""
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "device":
			dev = a.Value.String()
		case "relay":
			k += " @" + a.Value.String()
		case "err", "reason":
			e := a.Value.String()
			if i := strings.LastIndex(e, ": "); i >= 0 {
				e = e[i+2:]
			}
			k += ": " + e
		}
		return true
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[k]++
	if r.Message == "agent connected" {
		if t, ok := c.since[dev]; ok && r.Time.Sub(t) > 1500*time.Millisecond {
			fmt.Fprintf(os.Stderr, "%s away %v: %s\n", dev, r.Time.Sub(t).Round(time.Millisecond), strings.Join(c.trail[dev], " | "))
		}
		delete(c.since, dev)
		delete(c.trail, dev)
		return nil
	}
	if _, ok := c.since[dev]; !ok {
		c.since[dev] = r.Time
	}
	c.trail[dev] = append(c.trail[dev], r.Time.Format("05.000")+" "+k)
	return nil
}

func (c *countingHandler) report(worker int) {
	for range time.Tick(time.Second) {
		c.mu.Lock()
		var b strings.Builder
		for k, v := range c.n {
			fmt.Fprintf(&b, "  %d× %s\n", v, k)
		}
		clear(c.n)
		c.mu.Unlock()
		if b.Len() > 0 {
			fmt.Fprintf(os.Stderr, "%s agents from %d:\n%s", time.Now().Format("15:04:05.0"), worker, b.String())
		}
	}
}

// hotStandbyArgs are the relays' flags for -hot-standby.
func hotStandbyArgs() []string {
	if hotStandby {
		return []string{"--hot-standby"}
	}
	return nil
}
