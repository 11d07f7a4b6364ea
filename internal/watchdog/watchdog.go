// Package watchdog keeps a relay's opinion of its peers: it probes each on a
// short interval and vetoes a peer that has answered no probe for a
// silence, that fails enough probes in a row with an error, or at once
// when it refuses a connection, a probe's or the data path's. A
// connection to a peer that closes asks for a probe at once (ProbeSoon):
// a crashed relay's peers see all their connections to it close together.
// A veto expires after a TTL, so a watchdog that stops probing degrades to
// heartbeat staleness instead of pinning a stale opinion, and a probe that
// answers clears it. Vetoes say nothing about draining: drain holds are a separate
// set, kept in the fleet state, and clearing a veto never clears one.
package watchdog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Defaults of Config.
const (
	DefaultInterval = 100 * time.Millisecond
	DefaultTimeout  = 400 * time.Millisecond
	DefaultSilence  = 500 * time.Millisecond
	DefaultMisses   = 2
	DefaultVetoTTL  = 30 * time.Second
)

// Peer is a relay to watch.
type Peer struct {
	ID      string
	Address string
}

// Config configures a Watchdog. Zero fields take the defaults named on them.
type Config struct {
	// Interval between the starts of two probes of a peer. Default 100 ms.
	Interval time.Duration
	// Timeout caps one probe of a peer that answers quickly: a probe
	// unanswered by then is given up. Default 400 ms. A peer's own round
	// trips stretch it (see timeoutFor): a relay in another region, whose
	// answers take 200 ms, is given what its round trips say it needs.
	Timeout time.Duration
	// Silence vetoes a peer from which no probe has had an answer for
	// this long (a frozen or unreachable relay). Default 500 ms. Probes
	// overlap, one each Interval, so a peer's answers keep coming every
	// Interval however far away it is: what the silence measures is how
	// long a peer pauses, not its distance. Before a peer first answers,
	// its silence is at least four Timeouts (see silenceFor).
	Silence time.Duration
	// Misses in a row that fail with an error (an error status, a reset
	// connection) veto a peer. Default 2. A probe that times out is no
	// answer, which Silence counts, not a miss.
	Misses int
	// VetoTTL is how long a veto lasts unless a probe clears it first.
	// Default 30 s.
	VetoTTL time.Duration
	// Peers returns the relays to watch now. Required.
	Peers func() []Peer
	// Probe checks one peer within ctx. Required.
	Probe func(ctx context.Context, p Peer) error
	// Pulse, when set, opens a pulse with a peer (package pulse): a
	// connection on which Beat sends a beat each Interval and the peer
	// sends it straight back, past less of its other work than a probe
	// waits behind. While a peer's pulse is open its echoes are its
	// answers, and it is not probed. A peer whose pulse cannot be opened
	// (a relay that does not speak it) is probed, and its pulse tried
	// again after pulseRetry; one whose pulse ends is probed at once, as
	// for ProbeSoon: a relay that died refuses it. echo is told each
	// answer's round trip (negative: not timed), ended why the pulse
	// ended. Optional.
	Pulse func(ctx context.Context, p Peer, echo func(rtt time.Duration), ended func(error)) (Beater, error)
	// OnVeto is told of each new veto: the peer, how long since its first
	// miss (0 for a veto from the data path), and why. Optional.
	OnVeto func(id string, after time.Duration, reason error)
	// OnClear is told when a probe that answered clears a veto. Optional.
	OnClear func(id string)
	// Metrics is where the watchdog registers its metrics; nil registers
	// nowhere.
	Metrics prometheus.Registerer
	// Logger receives transitions; nil discards.
	Logger *slog.Logger
}

// Complete fills in defaults for zero fields.
func (c *Config) Complete() {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Silence <= 0 {
		c.Silence = DefaultSilence
	}
	if c.Misses <= 0 {
		c.Misses = DefaultMisses
	}
	if c.VetoTTL <= 0 {
		c.VetoTTL = DefaultVetoTTL
	}
	if c.OnVeto == nil {
		c.OnVeto = func(string, time.Duration, error) {}
	}
	if c.OnClear == nil {
		c.OnClear = func(string) {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Beater is an open pulse with a peer (see Config.Pulse).
type Beater interface {
	// Beat sends one beat, waiting at most timeout.
	Beat(timeout time.Duration) error
	// Close ends the pulse.
	Close() error
}

// pulseRetry is how long after a pulse could not be opened the watchdog
// tries again; the peer is probed meanwhile.
const pulseRetry = 10 * time.Second

// pulseSession is one pulse with a peer, opened or being opened.
type pulseSession struct{ b Beater }

// peerState is what the watchdog knows of one peer.
type peerState struct {
	misses     int // probes in a row that did not answer, timed out or failed
	failures   int // probes in a row that failed with an error (see Config.Misses)
	firstMiss  time.Time
	vetoUntil  time.Time
	answeredAt time.Time // when a probe last answered
	heardAt    time.Time // answeredAt, or before any answer the first probe's start
	// The peer's answered probes' round trips, smoothed as TCP smooths
	// its own (RFC 6298): the mean and the mean deviation; answered
	// counts them.
	srtt, rttvar time.Duration
	answered     int

	pulse      *pulseSession // open; nil while there is none
	dialing    bool          // a pulse is being opened
	pulseAfter time.Time     // no pulse is tried before then
}

// timeoutFor is how long a probe of a peer in state s may take: Timeout,
// or for a peer whose probes take long (a distant region) three of its
// smoothed round trips plus four deviations, if that is more; and until
// the peer first answered, four Timeouts, so that a peer far away is
// measured before its distance can veto it. It never exceeds
// maxTimeoutFactor Timeouts.
func (c *Config) timeoutFor(s *peerState) time.Duration {
	if s.answered == 0 {
		return 4 * c.Timeout
	}
	return min(max(c.Timeout, 3*s.srtt+4*s.rttvar), maxTimeoutFactor*c.Timeout)
}

// maxTimeoutFactor bounds a probe's timeout, in Timeouts.
const maxTimeoutFactor = 8

// silenceFor is how long a peer in state s may go without an answer:
// Silence, but never under three intervals (a peer is always given three
// probes), and more for a peer whose answers' times vary much (four
// deviations of its round trips: answers that come late by that much are
// the link, not a pause); and until the peer first answered, four
// Timeouts, as timeoutFor gives its first probes.
func (c *Config) silenceFor(s *peerState) time.Duration {
	if s.answered == 0 {
		return max(c.Silence, 4*c.Timeout)
	}
	return max(c.Silence, 3*c.Interval+4*s.rttvar)
}

// sample records a probe answered in rtt.
func (s *peerState) sample(rtt time.Duration) {
	if s.answered == 0 {
		s.srtt, s.rttvar = rtt, rtt/2
	} else {
		d := s.srtt - rtt
		if d < 0 {
			d = -d
		}
		s.rttvar = (3*s.rttvar + d) / 4
		s.srtt = (7*s.srtt + rtt) / 8
	}
	s.answered++
}

// Watchdog probes peers and keeps the veto set. It is safe for concurrent use.
type Watchdog struct {
	cfg     Config
	metrics metrics

	mu    sync.Mutex
	peers map[string]*peerState

	soon chan Peer // peers to probe before their next interval (ProbeSoon)
}

// New returns a watchdog; Run starts its probes.
func New(cfg Config) *Watchdog {
	cfg.Complete()
	return &Watchdog{cfg: cfg, metrics: newMetrics(cfg.Metrics), peers: map[string]*peerState{}, soon: make(chan Peer, soonQueue)}
}

// Vetoed reports whether id is vetoed now.
func (w *Watchdog) Vetoed(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.peers[id]
	return s != nil && time.Now().Before(s.vetoUntil)
}

// Answering reports whether id answered its last probe, within two
// intervals and a probe's timeout, and is not vetoed: this relay hears
// from it now, whatever the fleet state says of its heartbeats.
func (w *Watchdog) Answering(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.peers[id]
	if s == nil || s.misses > 0 || s.answered == 0 {
		return false
	}
	now := time.Now()
	return !now.Before(s.vetoUntil) && now.Sub(s.answeredAt) < w.cfg.silenceFor(s)
}

// Vetoes returns the ids vetoed now.
func (w *Watchdog) Vetoes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var out []string
	for id, s := range w.peers {
		if now.Before(s.vetoUntil) {
			out = append(out, id)
		}
	}
	return out
}

// Veto vetoes id at once: the data path found it refusing connections.
func (w *Watchdog) Veto(id string, reason error) {
	w.mu.Lock()
	s := w.state(id)
	now := time.Now()
	was := now.Before(s.vetoUntil)
	s.vetoUntil = now.Add(w.cfg.VetoTTL)
	w.mu.Unlock()
	if !was {
		w.cfg.Logger.Warn("peer vetoed: the data path could not reach it", logkey.RelayID, id, logkey.Err, reason)
		w.metrics.vetoed(CauseDataPath, 0)
		w.cfg.OnVeto(id, 0, reason)
	}
}

func (w *Watchdog) state(id string) *peerState {
	s := w.peers[id]
	if s == nil {
		s = &peerState{}
		w.peers[id] = s
	}
	return s
}

// soonQueue bounds the probes asked for by ProbeSoon and not yet started.
const soonQueue = 16

// ProbeSoon probes p now rather than at its next interval: a connection to
// it closed, which a relay that crashed does to all of them at once. A
// probe it refuses vetoes it at once (see probe), so the fleet moves a
// crashed relay's devices within milliseconds rather than after its
// missed probes. Asks beyond a small queue are dropped: the regular
// probes follow anyway.
func (w *Watchdog) ProbeSoon(p Peer) {
	select {
	case w.soon <- p:
	default:
	}
}

// Run probes every peer each Interval, and those ProbeSoon names at once,
// until ctx ends.
func (w *Watchdog) Run(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	// silent fires at the earliest moment a peer's silence would reach
	// its limit; answers only ever push that later, so it is set again
	// after each tick and each time it fires. due is when it should fire:
	// a timer that fires late says this relay is behind itself, and the
	// answers it has not read yet are no silence of its peers (see
	// maxLag).
	silent := time.NewTimer(time.Hour)
	defer silent.Stop()
	due := time.Now().Add(time.Hour)
	// ticked is when the last tick was handled. A tick handled more than
	// maxLag after its interval says the watchdog itself did not run
	// meanwhile (its process was stopped, or starved of CPU): its peers'
	// silences are pushed on by that much (see stalled), and no silence
	// is judged until the ticks are on time again.
	ticked := time.Now()
	defer w.closePulses() // after the goroutines that open them
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-w.soon:
			wg.Go(func() { w.probe(ctx, p) })
			continue
		case <-silent.C:
			if lag := time.Since(due); lag > w.maxLag() || time.Since(ticked) > w.cfg.Interval+w.maxLag() {
				w.metrics.behind()
				due = time.Now().Add(w.maxLag())
				silent.Reset(w.maxLag())
				continue
			}
			w.vetoSilent()
		case <-t.C:
			peers := w.cfg.Peers()
			w.forget(peers)
			// Probes overlap when a peer is slow: each tick starts one,
			// and at most one probe's timeout (see timeoutFor) over
			// Interval, plus one, are ever in flight.
			for _, p := range peers {
				w.heard(p.ID)
				if w.beat(p) {
					continue
				}
				if w.cfg.Pulse != nil {
					w.openPulse(ctx, &wg, p)
				}
				wg.Go(func() { w.probe(ctx, p) })
			}
			now := time.Now()
			if late := now.Sub(ticked) - w.cfg.Interval; late > w.maxLag() {
				w.stalled(late)
			}
			ticked = now
		}
		next := w.untilSilent()
		due = time.Now().Add(next)
		silent.Reset(next)
	}
}

// maxLag is how late the silence's timer may fire for the watchdog to
// trust what it has heard: half an interval. A relay so busy that its own
// timers run later than that (10,000 agents arriving at once on a small
// machine) may have its peers' answers waiting unread; it looks again
// half an interval later, and vetoes only once it has caught up with
// itself. A frozen peer's veto waits for that too; a busy peer, which
// answers late, is not confused with one that does not answer.
func (w *Watchdog) maxLag() time.Duration { return w.cfg.Interval / 2 }

// stalled pushes every peer's silence on by d, the time the watchdog
// did not run: what it did not hear while it was stopped says nothing of
// its peers, whose answers may be waiting unread. A relay thawed after
// SIGSTOP would otherwise find every peer silent for as long as it was
// stopped, veto them all, and promote the standbys it keeps for their
// devices.
func (w *Watchdog) stalled(d time.Duration) {
	w.mu.Lock()
	now := time.Now()
	for _, s := range w.peers {
		if !s.heardAt.IsZero() {
			s.heardAt = s.heardAt.Add(d)
			if s.heardAt.After(now) {
				s.heardAt = now
			}
		}
	}
	w.mu.Unlock()
	w.metrics.behind()
	level := slog.LevelDebug // a busy relay's ticks run late often
	if d >= time.Second {
		level = slog.LevelInfo // a relay stopped and continued
	}
	w.cfg.Logger.Log(context.Background(), level, "the watchdog did not run for a while; its peers' silences are counted from later", logkey.DurationMS, d.Milliseconds())
}

// beat sends p a beat on its pulse, and reports whether it has one that
// took it. A pulse that cannot is closed, and p probed instead.
func (w *Watchdog) beat(p Peer) bool {
	w.mu.Lock()
	ps := w.state(p.ID).pulse
	w.mu.Unlock()
	if ps == nil {
		return false
	}
	err := ps.b.Beat(w.maxLag())
	if err == nil {
		return true
	}
	w.dropPulse(p.ID, ps, err)
	ps.b.Close()
	return false
}

// openPulse opens a pulse with p on a goroutine of wg, unless it has one,
// one is being opened, or the last try was too recent.
func (w *Watchdog) openPulse(ctx context.Context, wg *sync.WaitGroup, p Peer) {
	w.mu.Lock()
	s := w.state(p.ID)
	if s.pulse != nil || s.dialing || time.Now().Before(s.pulseAfter) {
		w.mu.Unlock()
		return
	}
	s.dialing = true
	timeout := w.cfg.timeoutFor(s)
	w.mu.Unlock()
	wg.Go(func() {
		ps := &pulseSession{}
		dctx, cancel := context.WithTimeout(ctx, timeout)
		b, err := w.cfg.Pulse(dctx, p,
			func(rtt time.Duration) { w.answered(p.ID, rtt) },
			func(err error) {
				w.dropPulse(p.ID, ps, err)
				w.ProbeSoon(p) // a relay that died refuses it
			})
		cancel()
		w.mu.Lock()
		s.dialing = false
		if err != nil {
			s.pulseAfter = time.Now().Add(pulseRetry)
			w.mu.Unlock()
			if ctx.Err() == nil {
				w.cfg.Logger.Debug("no pulse with the peer; probing it instead", logkey.RelayID, p.ID, logkey.Err, err)
			}
			return
		}
		if ctx.Err() != nil || w.peers[p.ID] != s {
			w.mu.Unlock()
			b.Close() // the watchdog stops, or forgot the peer meanwhile
			return
		}
		ps.b = b
		s.pulse = ps
		w.mu.Unlock()
		w.metrics.pulses.Inc()
	})
}

// dropPulse forgets the pulse ps of peer id, if it is still the peer's.
func (w *Watchdog) dropPulse(id string, ps *pulseSession, err error) {
	w.mu.Lock()
	s := w.peers[id]
	mine := s != nil && s.pulse == ps
	if mine {
		s.pulse = nil
	}
	w.mu.Unlock()
	if mine {
		w.metrics.pulses.Dec()
		w.cfg.Logger.Debug("the pulse with the peer ended", logkey.RelayID, id, logkey.Err, err)
	}
}

// closePulses ends every pulse: the watchdog stops.
func (w *Watchdog) closePulses() {
	w.mu.Lock()
	var open []Beater
	for _, s := range w.peers {
		if s.pulse != nil {
			open = append(open, s.pulse.b)
			s.pulse = nil
		}
	}
	w.mu.Unlock()
	w.metrics.pulses.Sub(float64(len(open)))
	for _, b := range open {
		b.Close()
	}
}

// answered records an answer from peer id, a probe's or a beat's echo,
// that took rtt (negative: not timed), and clears its veto.
func (w *Watchdog) answered(id string, rtt time.Duration) {
	now := time.Now()
	w.mu.Lock()
	s := w.peers[id]
	if s == nil {
		w.mu.Unlock()
		return
	}
	if rtt >= 0 {
		s.sample(rtt)
	}
	vetoed := now.Before(s.vetoUntil)
	s.misses, s.failures, s.vetoUntil, s.answeredAt, s.heardAt = 0, 0, time.Time{}, now, now
	w.mu.Unlock()
	if vetoed {
		w.cfg.Logger.Info("peer answers again; veto cleared", logkey.RelayID, id)
		w.cfg.OnClear(id)
	}
}

// heard starts the silence of a peer about to be probed for the first
// time: it counts from now until the peer answers.
func (w *Watchdog) heard(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.state(id); s.heardAt.IsZero() {
		s.heardAt = time.Now()
	}
}

// untilSilent is how long until the first peer not vetoed reaches its
// silence limit; an hour when there is none.
func (w *Watchdog) untilSilent() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	next := time.Hour
	for _, s := range w.peers {
		if s.heardAt.IsZero() || now.Before(s.vetoUntil) {
			continue
		}
		next = min(next, max(0, s.heardAt.Add(w.cfg.silenceFor(s)).Sub(now)))
	}
	return next
}

// vetoSilent vetoes each peer, not vetoed yet, that has answered nothing
// for its silence limit.
func (w *Watchdog) vetoSilent() {
	type silentPeer struct {
		id    string
		quiet time.Duration
	}
	var fired []silentPeer
	w.mu.Lock()
	now := time.Now()
	for id, s := range w.peers {
		quiet := now.Sub(s.heardAt)
		if s.heardAt.IsZero() || now.Before(s.vetoUntil) || quiet < w.cfg.silenceFor(s) {
			continue
		}
		s.vetoUntil = now.Add(w.cfg.VetoTTL)
		fired = append(fired, silentPeer{id, quiet})
	}
	w.mu.Unlock()
	for _, p := range fired {
		reason := fmt.Errorf("no probe answered for %s", p.quiet.Round(time.Millisecond))
		w.cfg.Logger.Warn("peer vetoed: it answered no probe", logkey.RelayID, p.id, logkey.Err, reason)
		w.metrics.vetoed(CauseSilence, p.quiet)
		w.cfg.OnVeto(p.id, p.quiet, reason)
	}
}

// probe checks one peer and records the outcome.
func (w *Watchdog) probe(ctx context.Context, p Peer) {
	w.mu.Lock()
	timeout := w.cfg.timeoutFor(w.state(p.ID))
	w.mu.Unlock()
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	err := w.cfg.Probe(pctx, p)
	if err == nil && pctx.Err() != nil {
		err = pctx.Err()
	}
	cancel()
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	if err == nil {
		w.answered(p.ID, now.Sub(start))
		return
	}
	w.mu.Lock()
	s := w.state(p.ID)
	if s.misses == 0 {
		s.firstMiss = start // the probe began before it missed
		if !errors.Is(err, context.DeadlineExceeded) {
			s.firstMiss = now
		}
	}
	s.misses++
	// A probe that timed out is no answer, which the silence counts (see
	// vetoSilent); one that failed with an error is a miss.
	if !errors.Is(err, context.DeadlineExceeded) {
		s.failures++
	}
	// A peer that refuses the connection is not there: its process is
	// gone, and missing more probes would only keep its devices waiting.
	refused := errors.Is(err, syscall.ECONNREFUSED)
	fire := (s.failures >= w.cfg.Misses || refused) && !now.Before(s.vetoUntil)
	if fire {
		s.vetoUntil = now.Add(w.cfg.VetoTTL)
	}
	after := now.Sub(s.firstMiss)
	w.mu.Unlock()
	switch {
	case fire && refused:
		w.cfg.Logger.Warn("peer vetoed: it refused a probe's connection", logkey.RelayID, p.ID, logkey.Err, err)
	case fire:
		w.cfg.Logger.Warn("peer vetoed: its probes failed", logkey.RelayID, p.ID, logkey.Misses, w.cfg.Misses, logkey.Err, err)
	}
	if fire {
		w.metrics.vetoed(CauseProbes, after)
		w.cfg.OnVeto(p.ID, after, err)
	}
}

// forget drops the state of relays that are no longer peers.
func (w *Watchdog) forget(peers []Peer) {
	keep := make(map[string]bool, len(peers))
	for _, p := range peers {
		keep[p.ID] = true
	}
	var open []Beater
	w.mu.Lock()
	now := time.Now()
	for id, s := range w.peers {
		if !keep[id] && !now.Before(s.vetoUntil) {
			delete(w.peers, id)
			if s.pulse != nil {
				open = append(open, s.pulse.b)
			}
		}
	}
	w.mu.Unlock()
	w.metrics.pulses.Sub(float64(len(open)))
	for _, b := range open {
		b.Close()
	}
}
