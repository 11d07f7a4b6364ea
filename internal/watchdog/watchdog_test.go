package watchdog

import (
	"context"
	"errors"
	"io"
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
	paused chan struct{}            // when set, every probe waits until it closes (a process stopped, then continued)
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
	down, gone, frozen, slow, paused := f.down[p.ID], f.gone[p.ID], f.frozen[p.ID], f.slow[p.ID], f.paused
	f.mu.Unlock()
	if paused != nil {
		select {
		case <-paused:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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

// TestFrozenPeerVetoedBySilence: with the defaults, a peer that stops
// answering is vetoed when its silence, counted from its last answer (at
// most an interval before it froze), reaches Silence.
func TestFrozenPeerVetoedBySilence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{}) // defaults: 100 ms, 400 ms, 500 ms of silence
		stop := run(t, w)
		defer stop()
		elapse(time.Second + 30*time.Millisecond)
		froze := time.Now()
		f.set(f.frozen, "b", true)
		for !w.Vetoed("b") {
			elapse(time.Millisecond)
		}
		took := time.Since(froze)
		t.Logf("frozen peer vetoed after %s", took)
		if lo, hi := DefaultSilence-DefaultInterval, DefaultSilence; took < lo || took > hi {
			t.Errorf("a frozen peer took %s to veto with the defaults, want %s–%s", took, lo, hi)
		}
		f.mu.Lock()
		if len(f.vetoes) != 1 || f.vetoes[0].id != "b" || f.vetoes[0].after != DefaultSilence {
			t.Errorf("veto records %+v, want one for b after %s of silence", f.vetoes, DefaultSilence)
		}
		f.mu.Unlock()
		if w.Vetoed("a") {
			t.Error("the peer that answers is vetoed")
		}
	})
}

// TestTimeoutsAreNotMisses: probes that time out are counted by the
// silence alone, so a longer Silence holds a frozen peer's veto back
// however many of its probes time out meanwhile.
func TestTimeoutsAreNotMisses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{Silence: 2 * time.Second})
		stop := run(t, w)
		defer stop()
		elapse(time.Second + 30*time.Millisecond)
		froze := time.Now()
		f.set(f.frozen, "b", true)
		elapse(1800 * time.Millisecond) // ten and more timeouts
		if w.Vetoed("b") {
			t.Fatal("timed-out probes vetoed a peer before its silence was up")
		}
		for !w.Vetoed("b") {
			elapse(time.Millisecond)
		}
		if took := time.Since(froze); took > 2*time.Second {
			t.Errorf("vetoed %s after it froze, want ≤ 2 s", took)
		}
	})
}

// TestPausesShorterThanSilenceAreNotVetoed: a relay that stops answering
// for less than Silence less an interval (a process stopped and continued,
// or one too busy to answer for a while) keeps its devices, wherever in
// the probes' schedule the pause falls; a longer pause vetoes it.
func TestPausesShorterThanSilenceAreNotVetoed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}}
		w := newWatched(f, Config{}) // defaults: 100 ms, 400 ms, 500 ms of silence
		stop := run(t, w)
		defer stop()
		elapse(time.Second)
		pause := func(d time.Duration) {
			ch := make(chan struct{})
			f.mu.Lock()
			f.paused = ch
			f.mu.Unlock()
			elapse(d)
			f.mu.Lock()
			f.paused = nil
			f.mu.Unlock()
			close(ch)
		}
		for phase := range 10 { // each pause starts 10 ms further into an interval
			elapse(time.Duration(phase)*10*time.Millisecond + time.Millisecond)
			pause(DefaultSilence - DefaultInterval - 10*time.Millisecond)
			elapse(time.Second)
		}
		f.mu.Lock()
		vetoes := f.vetoes
		f.mu.Unlock()
		if len(vetoes) != 0 {
			t.Fatalf("pauses shorter than the silence vetoed: %+v", vetoes)
		}
		pause(DefaultSilence + 50*time.Millisecond)
		synctest.Wait()
		// The probes waiting out the pause answer as it ends, and clear
		// the vetoes it brought.
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.vetoes) != 2 || len(f.clears) != 2 {
			t.Fatalf("a pause longer than the silence: vetoes %+v, clears %v, want both vetoed and cleared", f.vetoes, f.clears)
		}
		if w.Vetoed("a") || w.Vetoed("b") {
			t.Fatalf("answers after the pause left vetoes %v", w.Vetoes())
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
		// Its answers come every interval all the same: the last ones
		// were on their way as it froze, and a silence after the last of
		// them it is vetoed, as a neighbour would be. (The loop looks
		// every 10 ms.)
		if limit := 600*time.Millisecond + DefaultSilence + 10*time.Millisecond; took > limit {
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

// fakePulses opens pulses with fakePeers: a beat is echoed at once, on
// the goroutine that sends it, unless its peer is frozen, a gone peer's pulse ends and cannot be
// opened again, and peers in noPulse refuse the upgrade.
type fakePulses struct {
	f       *fakePeers
	mu      sync.Mutex
	noPulse map[string]bool
	dials   map[string]int
	open    map[string]*fakeBeater
	probes  map[string]int
}

type fakeBeater struct {
	p      *fakePulses
	id     string
	echo   func(time.Duration)
	ended  func(error)
	closed bool
}

func (fp *fakePulses) dial(_ context.Context, p Peer, echo func(time.Duration), ended func(error)) (Beater, error) {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	fp.dials[p.ID]++
	fp.f.mu.Lock()
	gone := fp.f.gone[p.ID]
	fp.f.mu.Unlock()
	switch {
	case gone:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	case fp.noPulse[p.ID]:
		return nil, errors.New("the relay answered 200: it does not speak the pulse")
	}
	b := &fakeBeater{p: fp, id: p.ID, echo: echo, ended: ended}
	fp.open[p.ID] = b
	return b, nil
}

func (b *fakeBeater) Beat(time.Duration) error {
	b.p.f.mu.Lock()
	frozen, gone := b.p.f.frozen[b.id], b.p.f.gone[b.id]
	b.p.f.mu.Unlock()
	if gone {
		return net.ErrClosed
	}
	if !frozen {
		b.echo(0) // as the reader of a real pulse would, before the peer's end
	}
	return nil
}

func (b *fakeBeater) Close() error {
	b.p.mu.Lock()
	defer b.p.mu.Unlock()
	b.closed = true
	return nil
}

// kill ends id's pulse as a relay's death does, and refuses what follows.
func (fp *fakePulses) kill(id string) {
	fp.f.set(fp.f.gone, id, true)
	fp.mu.Lock()
	b := fp.open[id]
	fp.mu.Unlock()
	b.ended(io.ErrUnexpectedEOF)
}

func newPulsed(f *fakePeers, cfg Config) (*Watchdog, *fakePulses) {
	fp := &fakePulses{f: f, noPulse: map[string]bool{}, dials: map[string]int{}, open: map[string]*fakeBeater{}, probes: map[string]int{}}
	cfg.Peers = func() []Peer { return []Peer{{ID: "a"}, {ID: "b"}} }
	cfg.Probe = func(ctx context.Context, p Peer) error {
		fp.mu.Lock()
		fp.probes[p.ID]++
		fp.mu.Unlock()
		return f.probe(ctx, p)
	}
	cfg.Pulse = fp.dial
	cfg.OnVeto = func(id string, after time.Duration, _ error) {
		f.mu.Lock()
		f.vetoes = append(f.vetoes, vetoRecord{id, after, time.Now()})
		f.mu.Unlock()
	}
	return New(cfg), fp
}

func (fp *fakePulses) counts(id string) (dials, probes int) {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return fp.dials[id], fp.probes[id]
}

// TestPulseStandsInForProbes: once a peer's pulse is open it is not
// probed, its echoes keep it answering, and when they stop it is vetoed
// by its silence as a probed peer would be. The watchdog closes its
// pulses when it stops.
func TestPulseStandsInForProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, gone: map[string]bool{}, frozen: map[string]bool{}}
		w, fp := newPulsed(f, Config{})
		stop := run(t, w)
		elapse(time.Second)
		_, before := fp.counts("a")
		elapse(5*time.Second + 30*time.Millisecond) // between two ticks
		dials, probes := fp.counts("a")
		if dials != 1 || probes != before || before > 1 {
			t.Errorf("with its pulse open: %d dials, %d probes (%d in the first second), want 1 dial and no probe after the first", dials, probes, before)
		}
		if !w.Answering("a") || !w.Answering("b") {
			t.Fatal("peers whose beats come back are not answering")
		}
		froze := time.Now()
		f.set(f.frozen, "b", true)
		for !w.Vetoed("b") {
			elapse(time.Millisecond)
		}
		if took, lo, hi := time.Since(froze), DefaultSilence-DefaultInterval, DefaultSilence; took < lo || took > hi {
			t.Errorf("a frozen peer's pulse vetoed it after %s, want %s–%s", took, lo, hi)
		}
		if w.Vetoed("a") {
			t.Error("a peer whose beats come back is vetoed")
		}
		stop()
		fp.mu.Lock()
		defer fp.mu.Unlock()
		for id, b := range fp.open {
			if !b.closed {
				t.Errorf("%s's pulse was left open", id)
			}
		}
	})
}

// TestEndedPulseVetoesAtOnce: a relay that dies ends its pulses; its
// peers probe it at once, and its refusal vetoes it then.
func TestEndedPulseVetoesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, gone: map[string]bool{}, frozen: map[string]bool{}}
		w, fp := newPulsed(f, Config{})
		stop := run(t, w)
		defer stop()
		elapse(time.Second + 30*time.Millisecond) // between two ticks
		died := time.Now()
		fp.kill("a")
		synctest.Wait()
		if !w.Vetoed("a") || w.Vetoed("b") {
			t.Fatalf("vetoes %v right after a's pulse ended, want [a]", w.Vetoes())
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.vetoes) != 1 || !f.vetoes[0].at.Equal(died) {
			t.Errorf("veto records %+v, want one for a at %v", f.vetoes, died)
		}
	})
}

// TestPeerWithoutPulseIsProbed: a peer that does not speak the pulse (a
// relay of an earlier version) is probed each interval, and asked for a
// pulse again only every pulseRetry.
func TestPeerWithoutPulseIsProbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeers{down: map[string]bool{}, gone: map[string]bool{}, frozen: map[string]bool{}}
		w, fp := newPulsed(f, Config{})
		fp.noPulse["a"] = true
		stop := run(t, w)
		defer stop()
		elapse(pulseRetry + 5*time.Second + 30*time.Millisecond) // between two ticks
		dials, probes := fp.counts("a")
		if dials != 2 {
			t.Errorf("%d pulses asked of a peer without them in %s, want 2", dials, pulseRetry+5*time.Second)
		}
		if want := int((pulseRetry + 5*time.Second) / DefaultInterval); probes < want-1 || probes > want {
			t.Errorf("%d probes of a peer without a pulse, want %d", probes, want)
		}
		f.set(f.frozen, "a", true)
		froze := time.Now()
		for !w.Vetoed("a") {
			elapse(time.Millisecond)
		}
		if took := time.Since(froze); took > DefaultSilence {
			t.Errorf("a probed frozen peer vetoed after %s, want ≤ %s", took, DefaultSilence)
		}
	})
}

// TestStalledWatchdogVetoesNobody: a watchdog that did not run for a
// while (its relay stopped with SIGSTOP and continued, or starved of
// CPU) does not take the time it did not listen for its peers' silence:
// it vetoes none of them when it runs again, and still vetoes a peer
// that is silent afterwards.
func TestStalledWatchdogVetoesNobody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Answers take 10 ms: after the stall, the first look at the
		// silences comes before them, as a thawed relay's timers run before
		// it has read what waits in its sockets.
		f := &fakePeers{down: map[string]bool{}, frozen: map[string]bool{}, slow: map[string]time.Duration{"a": 10 * time.Millisecond, "b": 10 * time.Millisecond}}
		var mu sync.Mutex
		stall := time.Duration(0)
		w := newWatched(f, Config{})
		w.cfg.Peers = func() []Peer {
			mu.Lock()
			d := stall
			stall = 0
			mu.Unlock()
			elapse(d) // the watchdog's own goroutine does not run meanwhile
			return []Peer{{ID: "a"}, {ID: "b"}}
		}
		stop := run(t, w)
		defer stop()
		elapse(time.Second + 30*time.Millisecond)
		mu.Lock()
		stall = 3 * time.Second
		mu.Unlock()
		elapse(4 * time.Second)
		f.mu.Lock()
		vetoes := f.vetoes
		f.mu.Unlock()
		if len(vetoes) != 0 {
			t.Fatalf("a watchdog that stalled for 3 s vetoed %+v", vetoes)
		}
		f.set(f.frozen, "b", true)
		froze := time.Now()
		for !w.Vetoed("b") {
			elapse(time.Millisecond)
		}
		if took := time.Since(froze); took > DefaultSilence+11*time.Millisecond {
			t.Errorf("after the stall a frozen peer was vetoed %s after it froze, want ≤ %s", took, DefaultSilence)
		}
	})
}
