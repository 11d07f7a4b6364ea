// Command failover measures how a Switchboard fleet rides out the loss of a
// relay or of NATS. It runs three `switchboard serve` processes sharing one
// NATS server (hosted by this process, so that any relay may die), native
// agents for -devices devices in this process, and a steady load of GETs and
// POSTs; then, trial after trial, it kills a relay with SIGKILL, or freezes
// one with SIGSTOP, and measures for every device the relay held the time
// from the kill or freeze to the first successful request through a
// surviving relay, and counts the load's failed requests. Afterwards it
// checks that a new relay takes nothing, that a drain moves only the
// drained relay's devices without a failed request, how fast a directory
// change reaches every relay, and that requests keep working while NATS is
// down for -nats-outage. Last, on a fleet of its own, it runs a real
// three-node NATS cluster (nats-server processes, every bucket with three
// replicas), kills two of its nodes with SIGKILL for -nats-outage, and
// counts the failed requests and the time the fleet takes to converge once
// they are back.
//
//	go run ./bench/failover -trials 20 -md results.md
//	go run ./bench/failover -short                      # under a minute
//	go run ./bench/failover -scenarios quorum -nats-outage 60s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleet"
)

// allScenarios are the scenarios, in the order they run.
var allScenarios = []string{"kill", "freeze", "join", "drain", "place", "visibility", "nats", "quorum"}

func main() {
	var o options
	var scenarios, relayFlags string
	var short bool
	flag.IntVar(&o.devices, "devices", 100, "devices, each with one native agent")
	flag.IntVar(&o.trials, "trials", 20, "kill trials, and as many freeze trials")
	flag.StringVar(&o.bin, "bin", "", "switchboard binary (default: build one)")
	flag.StringVar(&o.natsServer, "nats-server", "", "nats-server binary for the quorum scenario (default: build one from the module)")
	flag.StringVar(&o.md, "md", "", "also write the results as Markdown to this file")
	flag.DurationVar(&o.probeEvery, "probe-every", 10*time.Millisecond, "interval of each affected device's probe requests")
	flag.DurationVar(&o.probeTimeout, "probe-timeout", time.Second, "how long one probe request may take: a probe sent while its forward goes to the frozen holder waits this long, which bounds the freeze's first success from below")
	flag.DurationVar(&o.gap, "gap", 11*time.Second, "least time between two trials: agents whose relays fail within 10 s of each other back off, by design")
	flag.DurationVar(&o.natsOutage, "nats-outage", 60*time.Second, "how long NATS is down (nats), or without its quorum (quorum): longer than the relays' fresh window")
	flag.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "the scenarios to run, comma-separated, of "+strings.Join(allScenarios, ", "))
	flag.StringVar(&relayFlags, "relay-flags", "", "more flags for every relay, space-separated (e.g. \"--probe-interval 100ms --probe-timeout 250ms\")")
	flag.BoolVar(&short, "short", false, "a run of under a minute, for CI: 10 devices, 1 kill trial, a 10 s NATS outage and quorum loss (-scenarios kill,nats,quorum)")
	flag.Parse()
	if short {
		o.devices, o.trials, o.natsOutage = 10, 1, 10*time.Second
		scenarios = "kill,nats,quorum"
	}
	o.scenarios = map[string]bool{}
	for _, sc := range strings.Split(scenarios, ",") {
		if sc = strings.TrimSpace(sc); sc == "" {
			continue
		}
		if !slices.Contains(allScenarios, sc) {
			log.Fatalf("unknown scenario %q: the scenarios are %s", sc, strings.Join(allScenarios, ", "))
		}
		o.scenarios[sc] = true
	}
	o.relayFlags = strings.Fields(relayFlags)
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

type options struct {
	devices, trials     int
	bin, natsServer, md string
	probeEvery, gap     time.Duration
	probeTimeout        time.Duration
	natsOutage          time.Duration
	scenarios           map[string]bool
	relayFlags          []string // added to every relay's command line
}

type bench struct {
	o      options
	bin    string
	dir    string
	f      *procfleet.Fleet
	agents *procfleet.Agents
	out    strings.Builder
	last   time.Time // when the last trial began, or the fleet came online
	// relayArgs are added to every relay's command line.
	relayArgs []string
	// nats names the NATS servers of a cluster; none: one hosted by the harness.
	nats []string
}

func run(o options) error {
	dir, err := os.MkdirTemp("", "switchboard-failover-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b := &bench{o: o, dir: dir, bin: o.bin, relayArgs: o.relayFlags}
	if b.bin, err = benchkit.Binary(b.bin, dir); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if slices.ContainsFunc(allScenarios, func(sc string) bool { return sc != "quorum" && o.scenarios[sc] }) {
		if err := b.single(ctx); err != nil {
			return err
		}
	}
	if o.scenarios["quorum"] {
		if err := b.quorum(ctx); err != nil {
			return err
		}
	}
	fmt.Print(b.out.String())
	if o.md != "" {
		return os.WriteFile(o.md, []byte(b.out.String()), 0o644)
	}
	return nil
}

// single runs the scenarios of three relays on one NATS server hosted by
// the harness.
func (b *bench) single(ctx context.Context) error {
	o := b.o
	devices, entries, backend, err := b.startFleet(ctx)
	if err != nil {
		return err
	}
	defer b.stop(backend)
	b.logf("# Failover: %d devices, 3 relays, %d trials each\n\n", len(devices), o.trials)
	if len(b.relayArgs) > 0 {
		b.logf("Relays run with `%s`.\n\n", strings.Join(b.relayArgs, " "))
	}
	b.logf("Relays are `switchboard serve` processes on one NATS (hosted by the harness); native agents and the backend run in the harness. Requests go through the surviving relays in turn, as through a load balancer whose health check has removed the dead one. The load alternates GET and POST, one request every 5 ms, to every device in turn through every relay that is up (two in three need a forward hop). Trials start at least %s apart, the first as long after the fleet came online (its standby tunnels up, its relays hearing each other).\n\n", o.gap)

	load := procfleet.StartLoad(ctx, b.f.Relays(), devices, 5*time.Millisecond)
	defer load.Stop()

	for _, kind := range []string{"kill", "freeze"} {
		if !o.scenarios[kind] {
			continue
		}
		var times []time.Duration
		timeouts := 0
		load.Reset()
		for trial := range o.trials {
			ts, lost, err := b.trial(ctx, kind, devices, load)
			if err != nil {
				return fmt.Errorf("%s trial %d: %w", kind, trial+1, err)
			}
			times = append(times, ts...)
			timeouts += lost
			fmt.Fprintf(os.Stderr, "%s trial %d: %d devices, p50 %s, max %s; load so far: %s\n", kind, trial+1, len(ts), pct(ts, 50), pct(ts, 100), load.Summary())
		}
		b.logf("- **%s** (%d trials, %d affected devices): first success after the %s p50 **%s**, p99 **%s**, max %s; %d devices not back within 10 s; the load during the trials: %s\n",
			map[string]string{"kill": "SIGKILL", "freeze": "SIGSTOP"}[kind], o.trials, len(times), map[string]string{"kill": "kill", "freeze": "freeze"}[kind],
			pct(times, 50), pct(times, 99), pct(times, 100), timeouts, load.Summary())
	}
	return b.extras(ctx, devices, entries, backend.URL(), load)
}

// startFleet starts three relays (in the bench's directory), a backend and
// an agent per device, and waits until every device is online. stop ends
// them.
func (b *bench) startFleet(ctx context.Context) (devices []string, entries []*url.URL, backend *procfleet.Backend, err error) {
	b.f, err = procfleet.Start(ctx, procfleet.Config{Bin: b.bin, Dir: b.dir, Relays: 3, NATS: b.nats, Args: b.relayArgs, Output: os.Stderr})
	if err != nil {
		return nil, nil, nil, err
	}
	if backend, err = procfleet.StartBackend(); err != nil {
		b.f.Close()
		return nil, nil, nil, err
	}
	b.agents = procfleet.NewAgents(ctx)
	entries = b.f.Entries()
	devices = make([]string, b.o.devices)
	for i := range devices {
		devices[i] = fmt.Sprintf("dev-%03d", i)
		if err := b.startAgent(entries, devices[i], backend.URL()); err != nil {
			b.stop(backend)
			return nil, nil, nil, err
		}
	}
	if err := b.f.WaitOnline(ctx, devices); err != nil {
		b.stop(backend)
		return nil, nil, nil, err
	}
	b.last = time.Now() // a fleet that just came up is not yet what a trial measures
	return devices, entries, backend, nil
}

// stop ends the agents, the backend and the fleet.
func (b *bench) stop(backend *procfleet.Backend) {
	b.agents.Stop()
	backend.Close()
	b.f.Close()
}

func (b *bench) logf(format string, args ...any) { fmt.Fprintf(&b.out, format, args...) }

// trial kills or freezes the relay holding most devices and returns, per
// device it held, the time to the first successful request through a
// surviving relay, and how many devices did not come back within 10 s.
func (b *bench) trial(ctx context.Context, kind string, devices []string, load *procfleet.Load) ([]time.Duration, int, error) {
	if err := b.f.WaitOnline(ctx, devices); err != nil {
		return nil, 0, err
	}
	where, err := b.f.Online(ctx)
	if err != nil {
		return nil, 0, err
	}
	load.SetHolders(where)
	victim, affected := b.f.Fullest(where)
	var survivors []string
	for _, r := range b.f.Relays() {
		if r != victim {
			survivors = append(survivors, r.URL())
		}
	}
	lose := victim.Kill // the load balancer's health check removes it at once
	if kind == "freeze" {
		lose = victim.Freeze
	}
	if wait := b.o.gap - time.Since(b.last); wait > 0 {
		<-time.After(wait)
	}
	start := time.Now()
	b.last = start
	if err := lose(); err != nil {
		return nil, 0, err
	}
	times := make([]time.Duration, len(affected))
	var wg sync.WaitGroup
	for i, d := range affected {
		wg.Go(func() { times[i] = b.firstSuccess(ctx, d, survivors, start) })
	}
	wg.Wait()
	for i, d := range affected {
		if times[i] > 800*time.Millisecond {
			fmt.Fprintf(os.Stderr, "  slow: %s %s\n", d, times[i])
		}
	}
	if evs, err := b.f.API(victim).Events(ctx, fleet.MaxEventsList); err == nil {
		var moves []time.Duration
		for _, e := range evs {
			if e.Type == fleet.EventDeviceMoved && e.Time.After(start) && e.From == victim.ID {
				moves = append(moves, time.Duration(e.DurationMS*float64(time.Millisecond)))
			}
		}
		fmt.Fprintf(os.Stderr, "  moves recorded by the fleet: %d, agent-measured p50 %s, max %s\n", len(moves), pct(moves, 50), pct(moves, 100))
	}
	var ok []time.Duration
	lost := 0
	for _, t := range times {
		if t < 0 {
			lost++
		} else {
			ok = append(ok, t)
		}
	}
	// Bring the relay back, once it has been down long enough for the
	// load's count to cover the whole failover: a killed one restarts on
	// its data dir (the same relay id), a frozen one resumes.
	if wait := minDown - time.Since(start); wait > 0 {
		<-time.After(wait)
	}
	if kind == "kill" {
		<-victim.Done()
		if err := b.f.Restart(ctx, victim); err != nil {
			return nil, 0, err
		}
	} else if err := victim.Thaw(); err != nil {
		return nil, 0, err
	}
	if err := b.f.WaitFresh(ctx); err != nil {
		return nil, 0, err
	}
	return ok, lost, b.f.WaitOnline(ctx, devices)
}

// minDown is how long a trial's victim stays dead or frozen at least.
const minDown = 3 * time.Second

// firstSuccess probes device through the relays in turn until a request
// succeeds, and returns how long after start; -1 after 10 s.
func (b *bench) firstSuccess(ctx context.Context, device string, relays []string, start time.Time) time.Duration {
	return benchkit.FirstOK(ctx, func(i int) string { return relays[i%len(relays)] + "/client/" + device + "/" },
		start, 10*time.Second, b.o.probeEvery, b.o.probeTimeout)
}

// extras measures the fleet's other promises under load, each scenario
// that was asked for.
func (b *bench) extras(ctx context.Context, devices []string, entries []*url.URL, backend *url.URL, load *procfleet.Load) error {
	b.logf("\n")
	if b.o.scenarios["join"] {
		if err := b.join(ctx); err != nil {
			return err
		}
	}
	if b.o.scenarios["drain"] {
		if err := b.drain(ctx, load); err != nil {
			return err
		}
	}
	if b.o.scenarios["place"] {
		if err := b.place(ctx, entries, backend); err != nil {
			return err
		}
	}
	if b.o.scenarios["visibility"] {
		// How fast a directory change reaches every relay.
		var spreads []time.Duration
		for i := range 50 {
			d := fmt.Sprintf("vis-%03d", i)
			seen, err := b.visibility(ctx, entries, d, backend)
			if err != nil {
				return err
			}
			spreads = append(spreads, seen)
		}
		b.logf("- **directory change visible on every relay** (from the first relay showing a new device to the last; 50 devices): p50 %s, p99 **%s**\n", pct(spreads, 50), pct(spreads, 99))
	}
	if b.o.scenarios["nats"] {
		return b.natsOutage(ctx, devices, load)
	}
	return nil
}

// join starts a fourth relay under load: stickiness moves nothing.
func (b *bench) join(ctx context.Context) error {
	before, err := b.directory(ctx)
	if err != nil {
		return err
	}
	if _, err := b.f.AddRelay(ctx); err != nil {
		return err
	}
	if err := b.f.WaitFresh(ctx); err != nil {
		return err
	}
	<-time.After(5 * time.Second) // a fixed window in which any move would happen
	after, err := b.directory(ctx)
	if err != nil {
		return err
	}
	moved := 0
	for d, r := range before {
		if after[d] != r {
			moved++
		}
	}
	b.logf("- **a 4th relay joins** under load: %d of %d devices moved (5 s watched)\n", moved, len(before))
	return nil
}

// drain drains the relay with the most devices: only its devices move, and
// no request fails.
func (b *bench) drain(ctx context.Context, load *procfleet.Load) error {
	after, err := b.directory(ctx)
	if err != nil {
		return err
	}
	load.SetHolders(after)
	victim, held := b.f.Fullest(after)
	load.Reset()
	drainStart := time.Now()
	if _, err := b.f.API(nil).SetRelayDraining(ctx, victim.ID, true); err != nil {
		return err
	}
	if err := benchkit.Poll(ctx, 60*time.Second, 50*time.Millisecond, func() error {
		now, err := b.directory(ctx)
		if err != nil {
			return err
		}
		for d, r := range after {
			if r == victim.ID && now[d] == victim.ID {
				return errors.New("devices still on the drained relay")
			}
		}
		return nil
	}); err != nil {
		return err
	}
	drained := time.Since(drainStart)
	final, err := b.directory(ctx)
	if err != nil {
		return err
	}
	others := 0
	for d, r := range after {
		if r != victim.ID && final[d] != r {
			others++
		}
	}
	attempted, failed := load.Counts()
	b.logf("- **drain** of the relay holding %d devices: all moved in %s; devices of other relays moved: %d; requests during the drain: %d, failed: %d (%s)\n",
		len(held), drained.Round(time.Millisecond), others, attempted, failed, load.Summary())
	_, err = b.f.API(nil).SetRelayDraining(ctx, victim.ID, false)
	return err
}

// place connects 1,000 new devices, 200 a second: how evenly the relays
// take them.
func (b *bench) place(ctx context.Context, entries []*url.URL, backend *url.URL) error {
	spread, total, err := b.placeMany(ctx, entries, backend, 1000)
	if err != nil {
		return err
	}
	sum := 0
	for _, k := range total {
		sum += k
	}
	b.logf("- **1,000 new devices over %d relays** (native agents arriving 200 a second, on top of the %d already there): all devices per relay %v, max/avg **%.3f**; the new ones alone %v (they even out what the failover trials left uneven)\n",
		len(total), sum-1000, total, float64(slices.Max(total))*float64(len(total))/float64(sum), spread)
	return nil
}

// natsOutage stops the NATS server under load for -nats-outage, longer
// than the relays' fresh window: devices already attached keep working,
// forwarded requests included, and the fleet converges once it is back.
func (b *bench) natsOutage(ctx context.Context, devices []string, load *procfleet.Load) error {
	dir, err := b.directory(ctx)
	if err != nil {
		return err
	}
	load.SetHolders(dir)
	load.Reset()
	b.f.StopNATS()
	<-time.After(b.o.natsOutage)
	attempted, failed := load.Counts()
	summary := load.Summary()
	view := b.viewAges(ctx)
	back := time.Now()
	if err := b.f.StartNATS(ctx); err != nil {
		return err
	}
	load.Reset()
	if err := b.converged(ctx, devices); err != nil {
		return err
	}
	converged := time.Since(back)
	after, afterFailed := load.Counts()
	b.logf("- **NATS down for %s** under load: %d requests, **%d failed** (%s); the relays' views were %s old at the end; back: every relay reaching NATS, every relay fresh and every device online after **%s**, %d of %d requests failed meanwhile\n",
		b.o.natsOutage, attempted, failed, summary, view, converged.Round(time.Millisecond), afterFailed, after)
	return nil
}

// viewAges returns how old each relay's view of the fleet is (ctl
// status's view_age_ms), for the report.
func (b *bench) viewAges(ctx context.Context) string {
	var out []string
	for _, r := range b.f.Relays() {
		s, err := b.f.APIOf(r).Status(ctx)
		if err != nil {
			out = append(out, "?")
			continue
		}
		out = append(out, (time.Duration(s.ViewAgeMS) * time.Millisecond).Round(100*time.Millisecond).String())
	}
	return strings.Join(out, ", ")
}

// converged waits until every relay reaches NATS again, sees every relay
// fresh, and has every device online.
func (b *bench) converged(ctx context.Context, devices []string) error {
	if err := benchkit.Poll(ctx, 120*time.Second, 50*time.Millisecond, func() error {
		for _, r := range b.f.Relays() {
			s, err := b.f.APIOf(r).Status(ctx)
			if err != nil {
				return err
			}
			if !s.NATSConnected || s.ViewAgeMS > 2000 {
				return fmt.Errorf("relay %d: NATS connected %v, view %d ms old", r.N, s.NATSConnected, s.ViewAgeMS)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := b.f.WaitFresh(ctx); err != nil {
		return err
	}
	return b.f.WaitOnline(ctx, devices)
}

// placeMany connects n agents for new devices, paced, waits until all are
// attached, and returns how many each relay took.
func (b *bench) placeMany(ctx context.Context, entries []*url.URL, backend *url.URL, n int) (newOnes, all []int, err error) {
	agents := procfleet.NewAgents(ctx)
	defer agents.Stop()
	names := make([]string, n)
	tick := time.NewTicker(5 * time.Millisecond)
	for i := range names {
		names[i] = fmt.Sprintf("many-%04d", i)
		if err := startAgent(agents, entries, names[i], backend); err != nil {
			return nil, nil, err
		}
		<-tick.C
	}
	tick.Stop()
	var counts, totals map[string]int
	err = benchkit.Poll(ctx, 60*time.Second, 50*time.Millisecond, func() error {
		dir, err := b.directory(ctx)
		if err != nil {
			return err
		}
		counts, totals = map[string]int{}, map[string]int{}
		for _, r := range dir {
			totals[r]++
		}
		for _, d := range names {
			if r, ok := dir[d]; ok {
				counts[r]++
			}
		}
		total := 0
		for _, c := range counts {
			total += c
		}
		if total < n {
			return fmt.Errorf("%d of %d attached", total, n)
		}
		return nil
	})
	for _, r := range b.f.Relays() {
		newOnes = append(newOnes, counts[r.ID])
		all = append(all, totals[r.ID])
	}
	return newOnes, all, err
}

// directory returns device → relay id.
func (b *bench) directory(ctx context.Context) (map[string]string, error) {
	return b.f.Directory(ctx)
}

// visibility connects an agent for device and returns the time between the
// first and the last relay showing it in their operator API.
func (b *bench) visibility(ctx context.Context, entries []*url.URL, device string, backend *url.URL) (time.Duration, error) {
	agents := procfleet.NewAgents(ctx)
	defer agents.Stop()
	if err := startAgent(agents, entries, device, backend); err != nil {
		return 0, err
	}
	relays := b.f.Relays()
	seen := make([]time.Time, len(relays))
	var wg sync.WaitGroup
	for i, r := range relays {
		wg.Go(func() {
			c := &http.Client{Timeout: time.Second}
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest(http.MethodGet, r.AdminURL()+control.PathDevices+"/"+device, nil)
				req.Header.Set("Authorization", "Bearer "+b.f.Token())
				if resp, err := c.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						seen[i] = time.Now()
						return
					}
				}
				<-time.After(time.Millisecond)
			}
		})
	}
	wg.Wait()
	first, last := seen[0], seen[0]
	for _, s := range seen {
		if s.IsZero() {
			return 0, fmt.Errorf("device %s never showed on every relay", device)
		}
		if s.Before(first) {
			first = s
		}
		if s.After(last) {
			last = s
		}
	}
	return last.Sub(first), nil
}

// startAgent starts a native agent for device in the bench's group.
func (b *bench) startAgent(entries []*url.URL, device string, backend *url.URL) error {
	return startAgent(b.agents, entries, device, backend)
}

func startAgent(agents *procfleet.Agents, entries []*url.URL, device string, backend *url.URL) error {
	return agents.Start(agent.Config{Relays: entries, Device: device, Backend: backend, Protocol: agent.ProtocolNative})
}

// pct returns the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	i = min(max(i-1, 0), len(s)-1)
	return s[i].Round(time.Millisecond)
}
