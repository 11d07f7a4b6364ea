// Package watchdog keeps a relay's opinion of its peers: it probes each on a
// short interval and vetoes a peer that misses enough probes in a row, or
// at once when it refuses a connection, a probe's or the data path's. A
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
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Defaults of Config.
const (
	DefaultInterval = 250 * time.Millisecond
	DefaultTimeout  = 400 * time.Millisecond
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
	// Interval between the starts of two probes of a peer. Default 250 ms.
	Interval time.Duration
	// Timeout caps one probe of a peer that answers quickly. Default
	// 400 ms. A peer's own round trips stretch it (see timeoutFor): a
	// relay in another region, whose answers take 200 ms, is given what
	// its round trips say it needs rather than vetoed for the distance.
	Timeout time.Duration
	// Misses in a row veto a peer. Default 2.
	Misses int
	// VetoTTL is how long a veto lasts unless a probe clears it first.
	// Default 30 s.
	VetoTTL time.Duration
	// Peers returns the relays to watch now. Required.
	Peers func() []Peer
	// Probe checks one peer within ctx. Required.
	Probe func(ctx context.Context, p Peer) error
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

// peerState is what the watchdog knows of one peer.
type peerState struct {
	misses     int
	firstMiss  time.Time
	vetoUntil  time.Time
	answeredAt time.Time // when a probe last answered
	// The peer's answered probes' round trips, smoothed as TCP smooths
	// its own (RFC 6298): the mean and the mean deviation; answered
	// counts them.
	srtt, rttvar time.Duration
	answered     int
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
	if s == nil || s.misses > 0 {
		return false
	}
	now := time.Now()
	return !now.Before(s.vetoUntil) && now.Sub(s.answeredAt) <= 2*w.cfg.Interval+w.cfg.timeoutFor(s)
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
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-w.soon:
			wg.Go(func() { w.probe(ctx, p) })
			continue
		case <-t.C:
		}
		peers := w.cfg.Peers()
		w.forget(peers)
		// Probes overlap when a peer is slow: each tick starts one, so a
		// frozen peer misses once per interval after its first timeout,
		// and at most one probe's timeout (see timeoutFor) over Interval, plus
		// one, are ever in flight.
		for _, p := range peers {
			wg.Go(func() { w.probe(ctx, p) })
		}
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
	w.mu.Lock()
	s := w.state(p.ID)
	if err == nil {
		s.sample(now.Sub(start))
		vetoed := now.Before(s.vetoUntil)
		s.misses, s.vetoUntil, s.answeredAt = 0, time.Time{}, now
		w.mu.Unlock()
		if vetoed {
			w.cfg.Logger.Info("peer answers again; veto cleared", logkey.RelayID, p.ID)
			w.cfg.OnClear(p.ID)
		}
		return
	}
	if s.misses == 0 {
		s.firstMiss = start // the probe began before it missed
		if !errors.Is(err, context.DeadlineExceeded) {
			s.firstMiss = now
		}
	}
	s.misses++
	// A peer that refuses the connection is not there: its process is
	// gone, and missing more probes would only keep its devices waiting.
	refused := errors.Is(err, syscall.ECONNREFUSED)
	fire := (s.misses >= w.cfg.Misses || refused) && !now.Before(s.vetoUntil)
	if fire {
		s.vetoUntil = now.Add(w.cfg.VetoTTL)
	}
	after := now.Sub(s.firstMiss)
	w.mu.Unlock()
	switch {
	case fire && refused:
		w.cfg.Logger.Warn("peer vetoed: it refused a probe's connection", logkey.RelayID, p.ID, logkey.Err, err)
	case fire:
		w.cfg.Logger.Warn("peer vetoed: it missed its probes", logkey.RelayID, p.ID, logkey.Misses, w.cfg.Misses, logkey.Err, err)
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
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for id, s := range w.peers {
		if !keep[id] && !now.Before(s.vetoUntil) {
			delete(w.peers, id)
		}
	}
}
