// Command idle measures a relay's memory per idle native agent: it starts a
// relay process, opens N native tunnels to it from this process (each served
// by a real HTTP/2 server, pinging as agents do), lets them settle, and
// reports the relay's resident memory and CPU per agent. With -standbys it
// also opens as many standby tunnels (for other devices, as a relay of a
// fleet keeps for agents held elsewhere), and with -agent-ping the agents
// ping at that interval and announce it, as agents that keep a standby do,
// while the relay keeps -ping.
//
//	go run ./bench/idle -agents 10000
//	go run ./bench/idle -agents 10000 -standbys 10000 -agent-ping 10s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

func main() {
	agents := flag.Int("agents", 10000, "idle native agents to connect")
	settle := flag.Duration("settle", 10*time.Second, "how long the agents stay idle before measuring")
	ping := flag.Duration("ping", 400*time.Millisecond, "the tunnels' ping interval (relay and agents); the timeout is 2.5×")
	version := flag.Int("tunnel-version", tunnel.V2, "the tunnel version the agents offer: 2 (the agent's default) or 1")
	bin := flag.String("bin", "", "switchboard binary (default: build one)")
	flag.StringVar(&heapProfile, "heap-profile", "", "save the relay's heap profile, taken after the idle period and a collection (live objects), to this file")
	flag.StringVar(&goroutineDump, "goroutine-dump", "", "save the relay's goroutines, counted by stack, after the idle period, to this file")
	flag.StringVar(&cpuProfile, "cpu-profile", "", "save the relay's CPU profile of the idle period to this file")
	flag.IntVar(&standbys, "standbys", 0, "standby tunnels to open besides the agents' tunnels (version 2 only)")
	flag.DurationVar(&agentPing, "agent-ping", 0, "the agents' own ping interval, announced to the relay (timeout half of it); 0 pings at -ping and announces nothing")
	flag.Parse()
	if *version != tunnel.V1 && *version != tunnel.V2 {
		log.Fatalf("-tunnel-version %d: use %d or %d", *version, tunnel.V1, tunnel.V2)
	}
	tunnelVersion = *version
	if err := run(*agents, *settle, *ping, *bin); err != nil {
		log.Fatal(err)
	}
}

// heapProfile, when set, receives the relay's heap profile.
var heapProfile string

// goroutineDump, when set, receives the relay's goroutines in text.
var goroutineDump string

// cpuProfile, when set, receives the relay's CPU profile of the idle
// period.
var cpuProfile string

// tunnelVersion is the version the agents offer; a relay that takes it is
// checked for each tunnel.
var tunnelVersion int

// standbys and agentPing are -standbys and -agent-ping.
var (
	standbys  int
	agentPing time.Duration
)

func run(n int, settle, ping time.Duration, bin string) error {
	live := tunnel.Liveness{Interval: ping, Timeout: ping * 5 / 2}
	dir, err := os.MkdirTemp("", "switchboard-idle-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin, err = benchkit.Binary(bin, dir); err != nil {
		return err
	}
	port, admin := benchkit.FreePort(), benchkit.FreePort()
	relay := exec.Command(bin, "serve", "--listen", "127.0.0.1:"+port, "--admin-listen", "127.0.0.1:"+admin,
		"--data", filepath.Join(dir, "data"), "--allow-anonymous-agents", "--log-level", "warn",
		"--tunnel-ping-interval", live.Interval.String(), "--tunnel-ping-timeout", live.Timeout.String())
	if standbys > 0 {
		relay.Args = append(relay.Args, "--hot-standby") // a relay keeps standbys only when told to
	}
	relay.Stderr = os.Stderr
	if f, err := os.Create(filepath.Join(os.TempDir(), "idle-relay.log")); err == nil {
		relay.Stderr = f
	}
	if err := relay.Start(); err != nil {
		return err
	}
	defer func() {
		relay.Process.Kill()
		relay.Wait()
	}()
	if err := waitReady("http://127.0.0.1:" + admin + "/readyz"); err != nil {
		return err
	}
	pid := relay.Process.Pid
	metrics := "http://127.0.0.1:" + admin + "/metrics"
	base := rssKB(pid)
	baseHeap, baseStack := benchkit.Gauge(metrics, "go_memstats_heap_inuse_bytes"), benchkit.Gauge(metrics, "go_memstats_stack_inuse_bytes")
	fmt.Printf("relay pid %d: baseline RSS %.1f MiB\n", pid, float64(base)/1024)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	start := time.Now()
	agentLive := live
	if agentPing > 0 {
		agentLive = tunnel.Liveness{Interval: agentPing, Timeout: agentPing / 2}
	}
	if err := connect(ctx, &wg, n, "http://127.0.0.1:"+port, agentLive, false); err != nil {
		return err
	}
	if err := waitSessions(metrics, n); err != nil {
		return fmt.Errorf("%w (first dial error: %v)", err, firstErr.Load())
	}
	if standbys > 0 {
		if err := connect(ctx, &wg, standbys, "http://127.0.0.1:"+port, agentLive, true); err != nil {
			return err
		}
		if err := waitStandbys(ctx, standbys); err != nil {
			return fmt.Errorf("%w (first dial error: %v)", err, firstErr.Load())
		}
	}
	fmt.Printf("%d tunnels and %d standbys connected in %v; idling %v (relay pings after %v of silence, agents after %v)\n",
		n, standbys, time.Since(start).Round(time.Millisecond), settle, 2*max(live.Interval, min(agentPing, time.Hour)), agentLive.Interval)
	token, _ := os.ReadFile(filepath.Join(dir, "data", "admin.token"))
	profiled := make(chan error, 1)
	if cpuProfile != "" {
		secs := max(1, int(settle.Seconds()))
		go func() {
			profiled <- benchkit.SaveProfile(fmt.Sprintf("http://127.0.0.1:%s/debug/pprof/profile?seconds=%d", admin, secs), strings.TrimSpace(string(token)), cpuProfile)
		}()
	}
	cpu0, t0 := cpuTicks(pid), time.Now()
	time.Sleep(settle)
	cpu := float64(cpuTicks(pid)-cpu0) / 100 / time.Since(t0).Seconds()
	rss := rssKB(pid)
	fmt.Printf("relay RSS %.1f MiB: %.1f KiB per idle agent (baseline subtracted); relay CPU %.1f%% of one core while idle\n",
		float64(rss)/1024, float64(rss-base)/float64(n), cpu*100)
	heap := benchkit.Gauge(metrics, "go_memstats_heap_inuse_bytes") - baseHeap
	stack := benchkit.Gauge(metrics, "go_memstats_stack_inuse_bytes") - baseStack
	fmt.Printf("of which Go heap in use %.1f KiB and goroutine stacks %.1f KiB per agent\n",
		heap/1024/float64(n), stack/1024/float64(n))
	// The rest of the RSS: free heap pages the runtime has not yet given
	// back, and the runtime's own structures.
	g := func(name string) float64 { return benchkit.Gauge(metrics, name) }
	retained := g("go_memstats_heap_idle_bytes") - g("go_memstats_heap_released_bytes")
	runtimeOwn := g("go_memstats_mspan_inuse_bytes") + g("go_memstats_gc_sys_bytes") + g("go_memstats_other_sys_bytes") + g("go_memstats_buck_hash_sys_bytes") + g("go_memstats_mcache_inuse_bytes")
	fmt.Printf("the rest: free heap kept from the OS %.1f MiB, the runtime's structures %.1f MiB; the collector's next goal %.1f MiB\n",
		retained/(1<<20), runtimeOwn/(1<<20), g("go_memstats_next_gc_bytes")/(1<<20))
	if cpuProfile != "" {
		if err := <-profiled; err != nil {
			return err
		}
	}
	for _, p := range []struct{ path, file string }{{"heap?gc=1", heapProfile}, {"goroutine?debug=1", goroutineDump}} {
		if p.file == "" {
			continue
		}
		if err := benchkit.SaveProfile("http://127.0.0.1:"+admin+"/debug/pprof/"+p.path, strings.TrimSpace(string(token)), p.file); err != nil {
			return err
		}
	}
	if left := benchkit.Gauge(metrics, "switchboard_tunnel_sessions"); left < float64(n) {
		fmt.Printf("WARNING: only %v of %d tunnels survived the idle period (pings missed on an overloaded machine)\n", left, n)
	}
	return nil
}

// firstErr keeps the first failed dial for the report.
var firstErr atomic.Value

// standbysUp counts the standby tunnels open.
var standbysUp atomic.Int64

// waitStandbys waits until n standby tunnels are open.
func waitStandbys(ctx context.Context, n int) error {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		if standbysUp.Load() >= int64(n) {
			return nil
		}
	}
	return fmt.Errorf("only %d of %d standby tunnels opened", standbysUp.Load(), n)
}

// connect opens n tunnels (standby ones when standby is set), each served
// until ctx ends.
func connect(ctx context.Context, wg *sync.WaitGroup, n int, relay string, live tunnel.Liveness, standby bool) error {
	u, _ := url.Parse(relay)
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	announce, err := service.Announce([]service.Service{{Name: service.Default, Kind: service.HTTP, Addr: "127.0.0.1:1"}}, false)
	if err != nil {
		return err
	}
	refuse := func(context.Context, string) (net.Conn, error) { return nil, errors.New("idle agents serve nothing") }
	sem := make(chan struct{}, 64)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			device := "idle-" + strconv.Itoa(i)
			if standby {
				device = "standby-" + strconv.Itoa(i)
			}
			var header http.Header
			if agentPing > 0 {
				header = http.Header{tunnel.PingHeader: {strconv.FormatInt(agentPing.Milliseconds(), 10)}}
			}
			conn, err := tunnel.Dial(ctx, tunnel.DialConfig{Relay: u, Device: device, Version: tunnelVersion, Services: announce, Standby: standby}, header)
			<-sem
			if err == nil && tunnel.VersionOf(conn) != tunnelVersion {
				conn.Close()
				err = fmt.Errorf("the relay took version %d, not %d", tunnel.VersionOf(conn), tunnelVersion)
			}
			if err != nil {
				firstErr.CompareAndSwap(nil, fmt.Errorf("tunnel %d: %w", i, err))
				return
			}
			if standby {
				standbysUp.Add(1)
			}
			if tunnelVersion == tunnel.V2 {
				tunnel.ServeStreams(ctx, conn, live, refuse)
				return
			}
			tunnel.Serve(ctx, conn, hello, live)
		})
	}
	return nil
}

func waitReady(u string) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(u); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return errors.New("relay did not become ready")
}

func waitSessions(metrics string, n int) error {
	got := 0.0
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if got = benchkit.Gauge(metrics, "switchboard_tunnel_sessions"); got >= float64(n) {
			return nil
		}
	}
	return fmt.Errorf("only %v of %d tunnels registered", got, n)
}

func rssKB(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb
		}
	}
	return 0
}

// cpuTicks returns the process's user+system time in clock ticks (1/100 s).
func cpuTicks(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}
