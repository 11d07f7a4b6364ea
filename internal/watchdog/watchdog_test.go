package watchdog

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Every test runs in a synctest bubble, on its virtual clock: a probe
// schedule of seconds runs in microseconds and is exact.

// elapse lets d of the bubble's virtual time pass on a timer of its fake
// clock, which jumps ahead as soon as every goroutine of the bubble is
// blocked: no test waits in real time.
func elapse(d time.Duration) { <-time.After(d) }

// fakePeers is a set of peers whose probes the test controls.
type fakePeers struct {
	mu     sync.Mutex
	down   map[string]bool          // probe fails at once (an error that is not a refusal)
	gone   map[string]bool          // probe's connection refused (ECONNREFUSED): the process is gone
	frozen map[string]bool          // probe hangs until its deadline
	slow   map[string]time.Duration // probe answers after this long (a distant peer)
	vetoes []vetoRecord
	clears []string
}

type vetoRecord struct {
	id    string
	after time.Duration
	at    time.Time
}

func (f *fakePeers) set(m map[string]bool, id string, v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m[id] = v
}

func (f *fakePeers) probe(ctx context.Context, p Peer) error {
	f.mu.Lock()
	down, gone, frozen, slow := f.down[p.ID], f.gone[p.ID], f.frozen[p.ID], f.slow[p.ID]
	f.mu.Unlock()
	if slow > 0 {
		select {
		case <-time.After(slow):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	switch {
	case frozen:
		<-ctx.Done()
		return ctx.Err()
	case down:
		return errors.New("probe answered 503")
	case gone:
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	return nil
}

func newWatched(f *fakePeers, cfg Config) *Watchdog {
	cfg.Peers = func() []Peer { return []Peer{{ID: "a"}, {ID: "b"}} }
	cfg.Probe = f.probe
	cfg.OnVeto = func(id string, after time.Duration, _ error) {
		f.mu.Lock()
		f.vetoes = append(f.vetoes, vetoRecord{id, after, time.Now()})
		f.mu.Unlock()
	}
	cfg.OnClear = func(id string) {
		f.mu.Lock()
		f.clears = append(f.clears, id)
		f.mu.Unlock()
	}
	return New(cfg)
}

func run(t *testing.T, w *Watchdog) (stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

func TestMissesVetoThenProbeClears(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{Interval: time.Second, Timeout: 700 * time.Millisecond, Misses: 2, VetoTTL: 30 * time.Second})
		stop := run(t, w)
		defer stop()

		elapse(1500 * time.Millisecond) // one healthy probe
		if w.Vetoed("a") {
			t.Fatal("a healthy peer is vetoed")
		}
		died := time.Now()
		f.set(f.down, "a", true)
		elapse(1100 * time.Millisecond) // one miss: not yet
		if w.Vetoed("a") {
			t.Fatal("vetoed after one miss")
		}
		elapse(time.Second) // second miss
		synctest.Wait()
		if !w.Vetoed("a") || w.Vetoed("b") {
			t.Fatalf("vetoes %v, want [a]", w.Vetoes())
		}
		f.mu.Lock()
		if len(f.vetoes) != 1 || f.vetoes[0].id != "a" || f.vetoes[0].at.Sub(died) > 2*time.Second || f.vetoes[0].after != time.Second {
			t.Errorf("veto records %+v (died at %v)", f.vetoes, died)
		}
		f.mu.Unlock()

		f.set(f.down, "a", false)
		elapse(time.Second)
		synctest.Wait()
		if w.Vetoed("a") {
			t.Fatal("a probe that answered did not clear the veto")
		}
		f.mu.Lock()
		if len(f.clears) != 1 || f.clears[0] != "a" {
			t.Errorf("clears %v", f.clears)
		}
		f.mu.Unlock()
	})
}

// TestRefusedProbeVetoesAtOnce: a peer whose probe's connection is refused
// (its process is gone) is vetoed by that one probe, and ProbeSoon, asked
// when a connection to it closed, probes it before its next interval.
func TestRefusedProbeVetoesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, gone: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{Interval: time.Second, Timeout: 700 * time.Millisecond, Misses: 2, VetoTTL: 30 * time.Second})
		stop := run(t, w)
		defer stop()
		elapse(1500 * time.Millisecond) // one healthy probe each
		f.set(f.gone, "a", true)
		died := time.Now()
		w.ProbeSoon(Peer{ID: "a"})
		synctest.Wait()
		if !w.Vetoed("a") || w.Vetoed("b") {
			t.Fatalf("vetoes %v right after a refused probe asked for, want [a]", w.Vetoes())
		}
		f.mu.Lock()
		if len(f.vetoes) != 1 || !f.vetoes[0].at.Equal(died) {
			t.Errorf("veto records %+v, want one for a at %v", f.vetoes, died)
		}
		f.mu.Unlock()

		// Without ProbeSoon, the next regular probe that is refused vetoes.
		f.set(f.gone, "b", true)
		elapse(time.Second)
		synctest.Wait()
		if !w.Vetoed("b") {
			t.Fatal("b's one refused probe did not veto it")
		}
	})
}

func TestFrozenPeerVetoedByTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{}) // defaults: 250 ms, 400 ms, 2 misses
		stop := run(t, w)
		defer stop()
		elapse(time.Second)
		froze := time.Now()
		f.set(f.frozen, "b", true)
		for !w.Vetoed("b") {
			elapse(10 * time.Millisecond)
		}
		took := time.Since(froze)
		t.Logf("frozen peer vetoed after %s", took)
		// The first probe to hang starts within an interval, the second an
		// interval later, and the veto comes when it times out.
		if limit := 2*DefaultInterval + DefaultTimeout + 10*time.Millisecond; took > limit { // the loop looks every 10 ms
			t.Errorf("a frozen peer took %s to veto with the defaults, want ≤ %s", took, limit)
		}
	})
}

// TestDistantPeerIsNotVetoed: a peer whose every answer takes longer
// than Timeout (a relay in another region) is measured and given the
// time its round trips say it needs, and is still vetoed when it freezes,
// within what its round trips allow.
func TestDistantPeerIsNotVetoed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}, slow: map[string]time.Duration{"a": 600 * time.Millisecond}}
		w := newWatched(f, Config{}) // defaults: a 400 ms timeout
		stop := run(t, w)
		defer stop()
		elapse(30 * time.Second)
		f.mu.Lock()
		vetoes := f.vetoes
		f.mu.Unlock()
		if len(vetoes) != 0 {
			t.Fatalf("a peer answering in 600 ms was vetoed: %+v", vetoes)
		}
		froze := time.Now()
		f.set(f.frozen, "a", true)
		for !w.Vetoed("a") {
			elapse(10 * time.Millisecond)
		}
		took := time.Since(froze)
		t.Logf("distant frozen peer vetoed after %s", took)
		// Its timeout: three round trips plus four deviations (1.8 s once
		// they are steady), capped at eight Timeouts.
		if limit := 2*DefaultInterval + maxTimeoutFactor*DefaultTimeout; took > limit {
			t.Errorf("a distant frozen peer took %s to veto, want ≤ %s", took, limit)
		}
	})
}

// TestTimeoutFollowsRoundTrips: the timeout of a peer's probes is
// Timeout while its answers are quick, grows with slow ones, and shrinks
// back when they are quick again; before any answer it is four Timeouts.
func TestTimeoutFollowsRoundTrips(t *testing.T) {
	cfg := Config{}
	cfg.Complete()
	s := &peerState{}
	if got := cfg.timeoutFor(s); got != 4*DefaultTimeout {
		t.Errorf("before any answer: %s, want %s", got, 4*DefaultTimeout)
	}
	for range 20 {
		s.sample(time.Millisecond)
	}
	if got := cfg.timeoutFor(s); got != DefaultTimeout {
		t.Errorf("quick answers: %s, want %s", got, DefaultTimeout)
	}
	for range 40 {
		s.sample(300 * time.Millisecond)
	}
	if got := cfg.timeoutFor(s); got < 900*time.Millisecond || got > 1200*time.Millisecond {
		t.Errorf("answers in 300 ms: %s, want about 3 × 300 ms", got)
	}
	for range 10 {
		s.sample(100 * time.Second)
	}
	if got := cfg.timeoutFor(s); got != maxTimeoutFactor*DefaultTimeout {
		t.Errorf("very slow answers: %s, want the cap %s", got, maxTimeoutFactor*DefaultTimeout)
	}
	for range 100 {
		s.sample(time.Millisecond)
	}
	if got := cfg.timeoutFor(s); got != DefaultTimeout {
		t.Errorf("quick again: %s, want %s", got, DefaultTimeout)
	}
}

func TestVetoExpiresAfterTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{VetoTTL: 30 * time.Second})
		// No Run: a dead watchdog. A data-path veto must not pin forever.
		w.Veto("a", errors.New("connection refused"))
		if !w.Vetoed("a") {
			t.Fatal("a data-path veto did not take")
		}
		elapse(29 * time.Second)
		if !w.Vetoed("a") {
			t.Fatal("the veto expired early")
		}
		elapse(2 * time.Second)
		if w.Vetoed("a") {
			t.Fatal("the veto outlived its TTL")
		}
		f.mu.Lock()
		if len(f.vetoes) != 1 || f.vetoes[0].after != 0 {
			t.Errorf("veto records %+v", f.vetoes)
		}
		f.mu.Unlock()
	})
}

func TestDataPathVetoClearedByProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{Interval: time.Second})
		stop := run(t, w)
		defer stop()
		w.Veto("b", errors.New("reset"))
		w.Veto("b", errors.New("reset again")) // still one veto event
		elapse(1500 * time.Millisecond)
		synctest.Wait()
		if w.Vetoed("b") {
			t.Fatal("an answering probe left the veto")
		}
		f.mu.Lock()
		if len(f.vetoes) != 1 {
			t.Errorf("%d veto events, want 1", len(f.vetoes))
		}
		f.mu.Unlock()
	})
}

func TestForgetsGonePeers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{"a": true}, frozen: map[string]bool{}}
		var mu sync.Mutex
		peers := []Peer{{ID: "a"}}
		w := New(Config{
			Interval: time.Second,
			Peers:    func() []Peer { mu.Lock(); defer mu.Unlock(); return peers },
			Probe:    f.probe,
			VetoTTL:  5 * time.Second,
		})
		stop := run(t, w)
		defer stop()
		elapse(2500 * time.Millisecond)
		if !w.Vetoed("a") {
			t.Fatal("not vetoed")
		}
		mu.Lock()
		peers = nil
		mu.Unlock()
		elapse(10 * time.Second)
		synctest.Wait()
		w.mu.Lock()
		n := len(w.peers)
		w.mu.Unlock()
		if n != 0 {
			t.Errorf("%d peers remembered after they left", n)
		}
	})
}

// TestVetoMetrics counts each veto in switchboard_watchdog_veto_seconds
// under its cause: missed probes, or the data path.
func TestVetoMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		f := &fakePeers{down: map[string]bool{"a": true}, frozen: map[string]bool{}}
		w := newWatched(f, Config{Interval: time.Second, Timeout: 700 * time.Millisecond, Misses: 2, Metrics: reg})
		stop := run(t, w)
		defer stop()
		elapse(2500 * time.Millisecond) // a misses twice
		synctest.Wait()
		w.Veto("b", errors.New("connection refused"))
		counts := map[string]uint64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "switchboard_watchdog_veto_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
		if counts[CauseProbes] != 1 || counts[CauseDataPath] != 1 {
			t.Errorf("vetoes counted by cause %v, want one of each", counts)
		}
	})
}

func TestAnsweringFollowsTheLastProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{Interval: time.Second, Timeout: 700 * time.Millisecond, Misses: 2, VetoTTL: 30 * time.Second})
		if w.Answering("a") {
			t.Fatal("a peer never probed is answering")
		}
		stop := run(t, w)
		elapse(1500 * time.Millisecond) // one probe answered
		if !w.Answering("a") || !w.Answering("b") {
			t.Fatal("peers that answered their probe are not answering")
		}
		f.set(f.down, "a", true)
		elapse(time.Second) // one miss
		synctest.Wait()
		if w.Answering("a") || !w.Answering("b") {
			t.Fatal("after a's miss: want a not answering, b answering")
		}
		f.set(f.down, "a", false)
		elapse(time.Second)
		synctest.Wait()
		if !w.Answering("a") {
			t.Fatal("a answered again but is not answering")
		}
		w.Veto("b", errors.New("refused"))
		if w.Answering("b") {
			t.Fatal("a vetoed peer is answering")
		}
		stop()
		elapse(5 * time.Second) // no probes since
		if w.Answering("a") {
			t.Fatal("a peer not probed for 5 s is answering")
		}
	})
}
