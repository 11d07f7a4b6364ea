package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
)

// path is one way from the clients to the backend.
type path struct {
	name         string
	addr         string          // what the clients dial
	relay, agent *procfleet.Proc // the processes whose memory is read; nil for direct
	admin        *control.Client // the relay's operator API, for its Go memory; nil for others
	note         string
}

// result is what was measured through one path.
type result struct {
	mbps               float64
	rttP50, rttP99     time.Duration
	setupP50, setupP99 time.Duration
	err                error
}

const device, svc = "bench", "echo"

// floor3 is the name of the path of three plain forwarders.
const floor3 = "floor, 3 processes"

func runPaths(ctx context.Context, cfg *config, dir string) error {
	bin, err := benchkit.Binary(cfg.bin, dir)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var procs []*procfleet.Proc
	defer func() {
		for _, p := range slices.Backward(procs) {
			p.Stop(10 * time.Second)
		}
	}()
	start := func(name, bin string, args ...string) (*procfleet.Proc, error) {
		out, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		p, err := procfleet.StartProc(name, bin, args, out)
		if err == nil {
			procs = append(procs, p)
		}
		return p, err
	}
	backend := "127.0.0.1:" + benchkit.FreePort()
	if _, err := start("backend", self, "-serve-backend", backend); err != nil {
		return err
	}
	if err := waitEcho(ctx, backend); err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	paths := []*path{{name: "direct", addr: backend}}

	// The floor: two forwarders.
	back, front := "127.0.0.1:"+benchkit.FreePort(), "127.0.0.1:"+benchkit.FreePort()
	fa, err := start("floor-agent", self, "-serve-forward", back, "-to", backend)
	if err != nil {
		return err
	}
	fr, err := start("floor-relay", self, "-serve-forward", front, "-to", back)
	if err != nil {
		return err
	}
	paths = append(paths, &path{name: "floor", addr: front, relay: fr, agent: fa})

	// The floor of connect's path, which has a process more than a
	// relay and an agent: three forwarders.
	back3, mid3, front3 := "127.0.0.1:"+benchkit.FreePort(), "127.0.0.1:"+benchkit.FreePort(), "127.0.0.1:"+benchkit.FreePort()
	for _, f := range [][3]string{{"floor3-agent", back3, backend}, {"floor3-middle", mid3, back3}, {"floor3-relay", front3, mid3}} {
		if _, err := start(f[0], self, "-serve-forward", f[1], "-to", f[2]); err != nil {
			return err
		}
	}
	paths = append(paths, &path{name: floor3, addr: front3,
		note: "three plain forwarders, as many processes as connect's path: what any design with a process beside the user costs here"})

	// Switchboard: one relay, one agent offering the backend as a TCP service.
	public, admin := "127.0.0.1:"+benchkit.FreePort(), "127.0.0.1:"+benchkit.FreePort()
	data := filepath.Join(dir, "relay")
	relay, err := start("relay", bin, "serve", "--listen", public, "--admin-listen", admin, "--data", data,
		"--allow-anonymous-agents", "--max-streams-per-device", "1000000", "--drain-timeout", "2s", "--log-level", "warn")
	if err != nil {
		return err
	}
	api, err := waitAPI(ctx, "http://"+admin, filepath.Join(data, "admin.token"))
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	agent, err := start("agent", bin, "agent", "--relay", "http://"+public, "--device", device,
		"--backend", "http://127.0.0.1:1", "--service", svc+"=tcp://"+backend, "--log-level", "warn")
	if err != nil {
		return err
	}
	user, err := api.CreateToken(ctx, control.TokenRequest{Kind: auth.KindUser, Name: "bench"})
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(dir, "user.token")
	if err := os.WriteFile(tokenFile, []byte(user.Token+"\n"), 0o600); err != nil {
		return err
	}
	local := "127.0.0.1:" + benchkit.FreePort()
	if _, err := start("connect", bin, "connect", "--relay", "http://"+public, "--token-file", tokenFile,
		"--listen", local, "--log-level", "warn", device+"/"+svc); err != nil {
		return err
	}
	paths = append(paths, &path{name: "connect", addr: local, relay: relay, agent: agent, admin: api,
		note: "one more process on the path: switchboard connect's local listener"})
	mapped, _ := strconv.Atoi(benchkit.FreePort())
	if _, err := api.AddPort(ctx, control.PortRequest{Port: mapped, Target: device + "/" + svc}); err != nil {
		return fmt.Errorf("map a port: %w", err)
	}
	paths = append(paths, &path{name: "mapped port", addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(mapped)), relay: relay, agent: agent, admin: api})

	for _, p := range cfg.peers {
		ctl, pub := "127.0.0.1:"+benchkit.FreePort(), "127.0.0.1:"+benchkit.FreePort()
		host, port, _ := strings.Cut(ctl, ":")
		srv, err := start(p.name+"-server", p.path, "server", "--host", host, "--port", port, "--reverse")
		if err != nil {
			return err
		}
		if err := waitListening(ctx, ctl); err != nil {
			return fmt.Errorf("%s server: %w", p.name, err)
		}
		cl, err := start(p.name+"-client", p.path, "client", "http://"+ctl, "R:"+pub+":"+backend)
		if err != nil {
			return err
		}
		paths = append(paths, &path{name: p.name, addr: pub, relay: srv, agent: cl})
	}
	for _, p := range paths {
		if err := waitEcho(ctx, p.addr); err != nil {
			return fmt.Errorf("%s: %w (logs in %s with -keep)", p.name, err, dir)
		}
	}

	results := map[string]*result{}
	for _, p := range paths {
		r := &result{}
		results[p.name] = r
		if cfg.tests["stream"] {
			r.mbps, r.err = throughput(p.addr, int64(cfg.mb)*1_000_000)
		}
		if cfg.tests["setup"] && r.err == nil {
			r.setupP50, r.setupP99, r.err = setups(p.addr, cfg.setupN)
		}
		fmt.Printf("measured %s\n", p.name)
	}
	if cfg.tests["stream"] {
		// The round trips, in rounds: each path's share of a round in
		// turn, so that a path measured last is not the one the machine's
		// drift (a neighbour, the clock's frequency) falls on.
		times := map[string][]time.Duration{}
		for round := range cfg.rounds {
			for _, p := range paths {
				if r := results[p.name]; r.err == nil {
					var ts []time.Duration
					ts, r.err = roundTrips(p.addr, cfg.n/cfg.rounds)
					times[p.name] = append(times[p.name], ts...)
				}
			}
			fmt.Printf("round trips: round %d of %d\n", round+1, cfg.rounds)
		}
		for name, ts := range times {
			results[name].rttP50, results[name].rttP99 = percentiles(ts)
		}
	}
	if cfg.tests["stream"] || cfg.tests["setup"] {
		printPaths(cfg, paths, results)
	}
	if cfg.tests["conns"] {
		for _, p := range paths {
			if cfg.through[p.name] {
				if err := manyConns(ctx, p, cfg.conns, cfg.heapDir); err != nil {
					fmt.Printf("%d connections through %s: %v\n", cfg.conns, p.name, err)
				}
			}
		}
	}
	return nil
}

// waitAPI waits until the relay's operator API answers, and returns a
// client of it with the relay's admin token.
func waitAPI(ctx context.Context, adminURL, tokenFile string) (*control.Client, error) {
	var c *control.Client
	err := benchkit.Poll(ctx, 20*time.Second, 50*time.Millisecond, func() error {
		tok, err := os.ReadFile(tokenFile)
		if err != nil {
			return err
		}
		c = &control.Client{BaseURL: adminURL, Token: strings.TrimSpace(string(tok))}
		_, err = c.ListPorts(ctx)
		return err
	})
	return c, err
}

func waitListening(ctx context.Context, addr string) error {
	return benchkit.Poll(ctx, 20*time.Second, 20*time.Millisecond, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// waitEcho waits until a round trip through addr comes back.
func waitEcho(ctx context.Context, addr string) error {
	return benchkit.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		_, err := setupOnce(addr, make([]byte, 32))
		return err
	})
}

// throughput sends n bytes from the backend over one connection and
// returns MB/s.
func throughput(addr string, n int64) (float64, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	var hdr [9]byte
	hdr[0] = cmdSource
	binary.BigEndian.PutUint64(hdr[1:], uint64(n))
	start := time.Now()
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	got, err := io.CopyBuffer(io.Discard, onlyReader{c}, make([]byte, 64<<10))
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("got %d bytes of %d", got, n)
	}
	return float64(n) / 1e6 / time.Since(start).Seconds(), nil
}

// roundTrips times n round trips of 32 bytes on one connection, after 100
// untimed ones.
func roundTrips(addr string, n int) ([]time.Duration, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := c.Write([]byte{cmdEcho}); err != nil {
		return nil, err
	}
	msg, back := make([]byte, 32), make([]byte, 32)
	times := make([]time.Duration, 0, n)
	for i := range n + 100 {
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return nil, err
		}
		if i >= 100 {
			times = append(times, time.Since(t0))
		}
	}
	return times, nil
}

// setups times n new connections, each to its first round trip of 32
// bytes, after 20 untimed ones.
func setups(addr string, n int) (p50, p99 time.Duration, err error) {
	msg := make([]byte, 32)
	var times []time.Duration
	for i := range n + 20 {
		d, err := setupOnce(addr, msg)
		if err != nil {
			return 0, 0, err
		}
		if i >= 20 {
			times = append(times, d)
		}
	}
	p50, p99 = percentiles(times)
	return p50, p99, nil
}

// setupOnce dials addr and makes one round trip of msg, and returns how
// long both took.
func setupOnce(addr string, msg []byte) (time.Duration, error) {
	t0 := time.Now()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(append([]byte{cmdEcho}, msg...)); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[min(len(ds)-1, len(ds)*99/100)]
}

// manyConns holds n connections open at once through p, each after one
// round trip, and reports the relay's and the agent's memory per
// connection: their RSS, and the relay's Go memory in use (heap and
// stacks, after a collection), which the paths measured before do not
// hide as they do RSS (Go keeps the heap it grew). With heapDir, the
// relay's heap profile while they are open is written there, and its
// goroutines' stacks beside it.
func manyConns(ctx context.Context, p *path, n int, heapDir string) error {
	relay0, _ := rss(p.relay)
	agent0, _ := rss(p.agent)
	goMem0, _ := goMemory(ctx, p.admin, "")
	conns := make([]net.Conn, n)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	start := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", p.addr, 10*time.Second)
			if err == nil {
				c.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err = c.Write([]byte{cmdEcho, 'x'}); err == nil {
					_, err = io.ReadFull(c, make([]byte, 1))
				}
				c.SetDeadline(time.Time{})
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				if c != nil {
					c.Close()
				}
				return
			}
			conns[i] = c
		})
	}
	wg.Wait()
	took := time.Since(start)
	open := 0
	for _, c := range conns {
		if c != nil {
			open++
		}
	}
	relay1, _ := rss(p.relay)
	agent1, _ := rss(p.agent)
	profile := ""
	if heapDir != "" {
		profile = filepath.Join(heapDir, "relay-heap-"+strings.ReplaceAll(p.name, " ", "-")+".pprof")
	}
	goMem1, goErr := goMemory(ctx, p.admin, profile)
	// One more round trip on each, all open: they all still carry.
	for _, c := range conns {
		if c == nil {
			continue
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write([]byte{'y'}); err == nil {
			_, err = io.ReadFull(c, make([]byte, 1))
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	fmt.Printf("\n%d TCP connections open at once to one device through %s: %d opened in %v (64 at a time), each echoing a byte\n",
		n, p.name, open, took.Round(time.Millisecond))
	fmt.Printf("  relay VmRSS %s → %s: %.1f KiB per connection\n", mib(relay0), mib(relay1), float64(relay1-relay0)/1024/float64(max(open, 1)))
	fmt.Printf("  agent VmRSS %s → %s: %.1f KiB per connection\n", mib(agent0), mib(agent1), float64(agent1-agent0)/1024/float64(max(open, 1)))
	switch {
	case p.admin == nil:
	case goErr != nil:
		fmt.Printf("  relay Go memory: %v\n", goErr)
	default:
		per := func(a, b int64) float64 { return float64(b-a) / 1024 / float64(max(open, 1)) }
		fmt.Printf("  relay Go memory in use (heap + stacks, after a GC) %s → %s: %.1f KiB per connection (heap %.1f, stacks %.1f); goroutines %d → %d\n",
			mib(goMem0.bytes), mib(goMem1.bytes), per(goMem0.bytes, goMem1.bytes), per(goMem0.heap, goMem1.heap), per(goMem0.stacks, goMem1.stacks),
			goMem0.goroutines, goMem1.goroutines)
		if profile != "" {
			fmt.Printf("  relay heap profile: %s\n", profile)
		}
	}
	if firstErr != nil {
		return fmt.Errorf("%d of %d failed; first: %w", n-open, n, firstErr)
	}
	return nil
}

// goMem is a relay's Go memory in use.
type goMem struct {
	bytes        int64 // heap in use and stacks
	heap, stacks int64
	goroutines   int64
}

// goMemory reads the relay's Go memory from its operator API after a
// collection (the heap profile's gc=1), writing the profile to file if
// one is given.
func goMemory(ctx context.Context, api *control.Client, file string) (goMem, error) {
	if api == nil {
		return goMem{}, nil
	}
	get := func(path string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.BaseURL+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+api.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return io.ReadAll(resp.Body)
	}
	prof, err := get(control.PathDebugProfiles + "heap?gc=1")
	if err != nil {
		return goMem{}, err
	}
	if file != "" {
		if err := os.WriteFile(file, prof, 0o644); err != nil {
			return goMem{}, err
		}
		stacks, err := get(control.PathDebugProfiles + "goroutine?debug=1")
		if err != nil {
			return goMem{}, err
		}
		if err := os.WriteFile(strings.TrimSuffix(file, ".pprof")+"-goroutines.txt", stacks, 0o644); err != nil {
			return goMem{}, err
		}
	}
	metrics, err := get(control.PathMetrics)
	if err != nil {
		return goMem{}, err
	}
	var m goMem
	for _, l := range strings.Split(string(metrics), "\n") {
		name, v, ok := strings.Cut(l, " ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			continue
		}
		switch name {
		case "go_memstats_heap_inuse_bytes":
			m.heap = int64(f)
		case "go_memstats_stack_inuse_bytes":
			m.stacks = int64(f)
		case "go_goroutines":
			m.goroutines = int64(f)
		}
	}
	m.bytes = m.heap + m.stacks
	return m, nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// rss reads a process's VmRSS.
func rss(p *procfleet.Proc) (int64, error) {
	if p == nil {
		return 0, nil
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", p.Pid())
}

// printPaths prints the paths' table, as markdown.
func printPaths(cfg *config, paths []*path, res map[string]*result) {
	direct := res["direct"]
	var chisel *result
	for _, p := range cfg.peers {
		chisel = res[p.name]
		break
	}
	fmt.Printf("\n| path | one stream MB/s | round trip p50 | p99 | setup p50 | p99 | setup added to direct (p50) |\n|---|---|---|---|---|---|---|\n")
	for _, p := range paths {
		r := res[p.name]
		if r.err != nil {
			fmt.Printf("| %s | failed: %v | | | | | |\n", p.name, r.err)
			continue
		}
		fmt.Printf("| %s | %.0f | %s | %s | %s | %s | %s |\n", p.name, r.mbps, us(r.rttP50), us(r.rttP99), us(r.setupP50), us(r.setupP99), us(r.setupP50-direct.setupP50))
	}
	for _, p := range paths {
		if p.note != "" {
			fmt.Printf("\n%s: %s\n", p.name, p.note)
		}
	}
	if chisel != nil && chisel.err == nil {
		for _, name := range []string{"connect", "mapped port"} {
			r := res[name]
			if r.err != nil || chisel.mbps == 0 {
				continue
			}
			fmt.Printf("%s against %s: throughput %.2f× (target ≥ 1.5×), round trip p50 %.2f× (target ≤ 1×)\n",
				name, cfg.peers[0].name, r.mbps/chisel.mbps, float64(r.rttP50)/float64(chisel.rttP50))
		}
		if f, c := res[floor3], res["connect"]; f != nil && f.err == nil && f.rttP50 > 0 && c != nil && c.err == nil && chisel.rttP50 > 0 {
			fmt.Printf("%s against %s: round trip p50 %.2f×; connect against %s: %.2f×\n",
				floor3, cfg.peers[0].name, float64(f.rttP50)/float64(chisel.rttP50), floor3, float64(c.rttP50)/float64(f.rttP50))
		}
	}
}

func us(d time.Duration) string {
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}
