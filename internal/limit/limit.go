// Package limit owns the relay's back-off of client addresses that keep
// failing to authenticate: a few failures are free, then the address is
// refused (429 with Retry-After) for a window that doubles with every
// further failure, up to a cap, and shrinks again once the failures stop.
// It remembers a bounded number of addresses, so that a flood from many
// source addresses cannot grow memory without bound.
//
// The intended call sequence, around every check of a presented credential
// (user, agent or admin token; an absent credential is not a failure, nor is
// a valid one that does not cover the device):
//
//	ip := limit.ClientIP(r, trustedProxies)
//	if err := lim.Check(ip); err != nil {
//		return err // *RefusedError: 429, Retry-After, a sentence for a person
//	}
//	if err := verify(credential); err != nil {
//		lim.Fail(ip)
//		return err
//	}
//	lim.Succeed(ip)
//
// Check is Allow wrapped in an error; callers that answer themselves use
// Allow's (retryAfter, ok) directly. A Limiter is safe for concurrent use;
// Allow takes no lock while no address is being refused.
package limit

import (
	"container/list"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Config is the back-off policy. Zero fields take the defaults named on
// them.
type Config struct {
	// FreeFailures is how many failed authentications an address may make
	// within Window before it is refused. Default 5.
	FreeFailures int
	// Window is the span in which the free failures are counted (from the
	// first failure of a series), and the quiet time after which a refused
	// address's next refusal window halves. Default 1 minute.
	Window time.Duration
	// BaseDelay is the first refusal window; every failure while the
	// address is penalised doubles it. Default 1 s.
	BaseDelay time.Duration
	// MaxDelay caps the refusal window. Default 5 minutes.
	MaxDelay time.Duration
	// MaxEntries bounds the addresses (IPv6: /64 prefixes) remembered; when
	// full, the one whose last failure is oldest is forgotten. About 200
	// bytes each. Default 65536 (some 13 MiB at most).
	MaxEntries int
	// Scope labels the metrics, for a relay with several limiters (users,
	// agents, admin). Default "auth".
	Scope string
	// Now is the clock; nil means time.Now. Tests inject one.
	Now func() time.Time
}

// Defaults of Config, in one place.
const (
	DefaultFreeFailures = 5
	DefaultWindow       = time.Minute
	DefaultBaseDelay    = time.Second
	DefaultMaxDelay     = 5 * time.Minute
	DefaultMaxEntries   = 1 << 16
)

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.FreeFailures <= 0 {
		c.FreeFailures = DefaultFreeFailures
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.BaseDelay <= 0 {
		c.BaseDelay = DefaultBaseDelay
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = DefaultMaxDelay
	}
	c.MaxDelay = max(c.MaxDelay, c.BaseDelay)
	if c.MaxEntries <= 0 {
		c.MaxEntries = DefaultMaxEntries
	}
	if c.Scope == "" {
		c.Scope = "auth"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Limiter tracks failed authentications per client address.
type Limiter struct {
	cfg     Config
	metrics metrics

	// refusingUntil is the latest end, in Unix nanoseconds, of any refusal
	// window handed out: before it Allow must look, after it no address is
	// refused and Allow returns at once.
	refusingUntil atomic.Int64
	refusals      atomic.Int64 // Allow said no
	penalties     atomic.Int64 // a failure opened a refusal window
	// tracked mirrors len(entries), so that Succeed, called on every good
	// credential, takes no lock while no address has failed.
	tracked atomic.Int64

	mu      sync.Mutex // guards the fields below
	entries map[netip.Prefix]*entry
	byAge   *list.List // of *entry, most recent failure first
}

// entry is what the limiter remembers of one address.
type entry struct {
	key         netip.Prefix
	elem        *list.Element
	failures    int       // failures of the current free series
	seriesStart time.Time // the first failure of that series
	level       int       // refusal windows so far: the next is BaseDelay·2^level
	refusedTill time.Time // end of the current refusal window
	calmSince   time.Time // from when quiet time halves the next window
}

// New returns a limiter with cfg's policy.
func New(cfg Config) *Limiter {
	cfg = cfg.withDefaults()
	return &Limiter{
		cfg:     cfg,
		metrics: newMetrics(cfg.Scope),
		entries: make(map[netip.Prefix]*entry),
		byAge:   list.New(),
	}
}

// Allow reports whether ip may present a credential now; if not, retryAfter
// says when it may again.
func (l *Limiter) Allow(ip netip.Addr) (retryAfter time.Duration, ok bool) {
	now := l.cfg.Now()
	if now.UnixNano() >= l.refusingUntil.Load() {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[Key(ip)]
	if e == nil || !now.Before(e.refusedTill) {
		return 0, true
	}
	l.refusals.Add(1)
	return e.refusedTill.Sub(now), false
}

// Check is Allow as an error: nil, or a *RefusedError for ip.
func (l *Limiter) Check(ip netip.Addr) error {
	if wait, ok := l.Allow(ip); !ok {
		return &RefusedError{IP: ip, RetryAfter: wait}
	}
	return nil
}

// Fail records a failed authentication from ip: within the free failures it
// only counts; past them, and for every failure while ip is penalised, it
// opens a refusal window twice as long as the last (BaseDelay first, at most
// MaxDelay).
func (l *Limiter) Fail(ip netip.Addr) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entryLocked(Key(ip), now)
	e.decay(now, l.cfg.Window)
	l.byAge.MoveToFront(e.elem)
	if e.level == 0 {
		if now.Sub(e.seriesStart) >= l.cfg.Window {
			e.failures, e.seriesStart = 0, now
		}
		if e.failures++; e.failures <= l.cfg.FreeFailures {
			return
		}
	}
	// The level grows only while the window is below MaxDelay, so that the
	// shift stays far from overflowing.
	d := l.cfg.MaxDelay
	if next := l.cfg.BaseDelay << e.level; next < d {
		d = next
		e.level++
	}
	e.refusedTill = now.Add(d)
	e.calmSince = e.refusedTill
	l.penalties.Add(1)
	if till := e.refusedTill.UnixNano(); till > l.refusingUntil.Load() {
		l.refusingUntil.Store(till) // under mu: no other writer
	}
}

// Succeed records a successful authentication from ip. It forgives the
// failures of the current free series (a person who mistyped, then got it
// right, starts afresh), but not a penalty, which only time undoes: a
// client holding one valid credential cannot wash away its failures with
// it.
func (l *Limiter) Succeed(ip netip.Addr) {
	if l.tracked.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := Key(ip)
	if e := l.entries[k]; e != nil {
		e.decay(l.cfg.Now(), l.cfg.Window)
		if e.level == 0 {
			l.removeLocked(e)
		}
	}
}

// Tracked returns how many addresses the limiter remembers.
func (l *Limiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}

// entryLocked returns k's entry, creating it, and evicting the entry with
// the oldest failure when the limiter is full. Entries that time has fully
// forgiven are dropped from the old end on the way.
func (l *Limiter) entryLocked(k netip.Prefix, now time.Time) *entry {
	if e := l.entries[k]; e != nil {
		return e
	}
	for range 2 { // a little sweeping per new entry keeps the map lean
		if back := l.byAge.Back(); back != nil && back.Value.(*entry).forgotten(now, l.cfg.Window) {
			l.removeLocked(back.Value.(*entry))
		}
	}
	for len(l.entries) >= l.cfg.MaxEntries {
		l.removeLocked(l.byAge.Back().Value.(*entry))
	}
	e := &entry{key: k} // its first failure starts a series
	e.elem = l.byAge.PushFront(e)
	l.entries[k] = e
	l.tracked.Store(int64(len(l.entries)))
	return e
}

func (l *Limiter) removeLocked(e *entry) {
	l.byAge.Remove(e.elem)
	delete(l.entries, e.key)
	l.tracked.Store(int64(len(l.entries)))
}

// decay halves the next refusal window (one level down) for every Window
// of quiet since the last refusal window ended.
func (e *entry) decay(now time.Time, window time.Duration) {
	if e.level == 0 || now.Before(e.calmSince) {
		return
	}
	steps := int(now.Sub(e.calmSince) / window)
	if steps == 0 {
		return
	}
	e.level = max(0, e.level-steps)
	e.calmSince = e.calmSince.Add(time.Duration(steps) * window)
	if e.level == 0 {
		e.failures, e.seriesStart = 0, time.Time{}
	}
}

// forgotten reports whether e holds nothing any more: no penalty left, and
// its free series is over.
func (e *entry) forgotten(now time.Time, window time.Duration) bool {
	e.decay(now, window)
	return e.level == 0 && !now.Before(e.refusedTill) && now.Sub(e.seriesStart) >= window
}
