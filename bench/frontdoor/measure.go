package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/fleet"
)

// loadResult counts a steady user load through the front door.
type loadResult struct {
	sent, failed int64
	forwards     float64 // switchboard_router_forwards_total gained over the fleet meanwhile
	firstErr     string
}

// share is the fraction of the requests sent that took a forward hop.
func (l loadResult) share() float64 {
	if l.sent == 0 {
		return 0
	}
	return l.forwards / float64(l.sent)
}

// userLoad sends rate small GETs a second through the front door, for
// random devices, half addressed by path and half by X-Server-Name, until
// stop is called.
type userLoad struct {
	s       *setup
	cancel  context.CancelFunc
	done    chan struct{}
	before  float64
	sent    atomic.Int64
	failed  atomic.Int64
	firstMu sync.Mutex
	first   string
}

func startUserLoad(ctx context.Context, s *setup, rate int) *userLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &userLoad{s: s, cancel: cancel, done: make(chan struct{}), before: s.forwards()}
	go func() {
		defer close(l.done)
		var wg sync.WaitGroup
		defer wg.Wait()
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			d := s.devices[rand.IntN(len(s.devices))]
			wg.Go(func() {
				err := s.get(d, fmt.Sprint("load", i), i%2 == 1)
				l.sent.Add(1)
				if err != nil {
					l.failed.Add(1)
					l.firstMu.Lock()
					if l.first == "" {
						l.first = err.Error()
					}
					l.firstMu.Unlock()
				}
			})
		}
	}()
	return l
}

// stop ends the load, waits for its requests, and reads the forwards.
func (l *userLoad) stop() loadResult {
	l.cancel()
	<-l.done
	return loadResult{sent: l.sent.Load(), failed: l.failed.Load(), forwards: l.s.forwards() - l.before, firstErr: l.first}
}

// steady runs the user load for d.
func steady(ctx context.Context, s *setup, rate int, d time.Duration) loadResult {
	l := startUserLoad(ctx, s, rate)
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return l.stop()
}

// trialResult is one kill -9 of the relay holding the most devices.
type trialResult struct {
	relay    int
	affected int
	back     []time.Duration // per affected device: kill to the first 200 through the front door
	lost     int             // devices not back within the limit
	lostOnes []string        // their names
	load     loadResult      // the user load from the kill until every device was back
}

// backWithin bounds how long a trial waits for a device to answer again.
const backWithin = 15 * time.Second

// loadAfterKill is how long at least the user load of a trial runs after
// the kill.
const loadAfterKill = 5 * time.Second

// rejoinAfter is how long after a killed relay restarts the fleet is
// measured again: nginx sends it requests again only once its
// fail_timeout (10 s) has passed.
const rejoinAfter = 12 * time.Second

// killTrial kills (SIGKILL) the relay holding the most devices under the
// user load and measures, per device it held, the time until a request
// through the front door succeeds again, probing every 10 ms on new
// connections. The load runs loadFor at least.
func killTrial(ctx context.Context, s *setup, rate int, loadFor time.Duration) (trialResult, *procfleet.Relay, error) {
	h, err := s.holders(ctx)
	if err != nil {
		return trialResult{}, nil, err
	}
	victim, affected := s.f.Fullest(h)
	res := trialResult{relay: victim.N, affected: len(affected), back: make([]time.Duration, 0, len(affected))}
	load := startUserLoad(ctx, s, rate)
	start := time.Now()
	if err := victim.Kill(); err != nil {
		load.stop()
		return res, nil, err
	}
	times := make([]time.Duration, len(affected))
	var wg sync.WaitGroup
	for i, d := range affected {
		wg.Go(func() { times[i] = firstSuccess(ctx, s.front.url, d, start) })
	}
	wg.Wait()
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(start.Add(loadFor))):
	}
	res.load = load.stop()
	for i, t := range times {
		if t < 0 {
			res.lost++
			res.lostOnes = append(res.lostOnes, affected[i])
		} else {
			res.back = append(res.back, t)
		}
	}
	<-victim.Done()
	return res, victim, nil
}

// restart starts a killed relay again on its data dir, waits until the
// fleet sees it, and then until after rejoinAfter.
func (s *setup) restart(ctx context.Context, r *procfleet.Relay) error {
	began := time.Now()
	if err := s.f.Restart(ctx, r); err != nil {
		return err
	}
	if err := s.f.WaitFresh(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(began.Add(rejoinAfter))):
	}
	return s.waitOnline(ctx)
}

// firstSuccess probes device through the front door every 10 ms until a
// request succeeds, and returns how long after start; -1 after backWithin.
func firstSuccess(ctx context.Context, front, device string, start time.Time) time.Duration {
	return benchkit.FirstOK(ctx, func(int) string { return front + "/client/" + device + "/small?probe" },
		start, backWithin, 10*time.Millisecond, 2*time.Second)
}

// pct returns the p-th percentile of ds (p in 0..100); 0 when empty.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// drainResult is one operator drain of the relay holding the most devices.
type drainResult struct {
	relay, devices int
	took           time.Duration // until the directory puts none of its devices on it
	left           int           // devices still on it at drainWithin
	load           loadResult    // the user load over the drain
}

// drainWithin bounds how long a drain trial waits for the relay to empty.
const drainWithin = 30 * time.Second

// drainTrial drains (ctl relays drain) the relay holding the most devices
// under the user load, waits until the directory puts none of its devices
// on it, then undrains it.
func drainTrial(ctx context.Context, s *setup, rate int) (drainResult, error) {
	h, err := s.holders(ctx)
	if err != nil {
		return drainResult{}, err
	}
	victim, held := s.f.Fullest(h)
	res := drainResult{relay: victim.N, devices: len(held)}
	load := startUserLoad(ctx, s, rate)
	start := time.Now()
	if _, err := s.f.API(nil).SetRelayDraining(ctx, victim.ID, true); err != nil {
		load.stop()
		return res, err
	}
	for time.Since(start) < drainWithin && ctx.Err() == nil {
		h, err := s.holders(ctx)
		if err == nil {
			left := 0
			for _, r := range h {
				if r == victim.ID {
					left++
				}
			}
			res.left = left
			if left == 0 && len(h) == len(s.devices) {
				break
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	res.took = time.Since(start)
	if ds, err := s.f.API(nil).ListDevices(ctx); err == nil {
		for _, d := range ds {
			if d.State != fleet.StateOnline || d.RelayID == victim.ID {
				fmt.Fprintf(os.Stderr, "  after the drain: %s %s on %s (%d agents, %s)\n", d.Name, d.State, d.RelayID, d.Agents, d.Protocol)
			}
		}
	}
	// The load runs on a while after the move, for the requests that
	// follow the last agents.
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
	res.load = load.stop()
	if _, err := s.f.API(nil).SetRelayDraining(ctx, victim.ID, false); err != nil {
		return res, err
	}
	return res, s.f.WaitFresh(ctx)
}
