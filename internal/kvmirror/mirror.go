// Package kvmirror keeps a whole JetStream key-value bucket in memory, fed
// by a watch, for the readers that must never wait for NATS: the fleet's
// relay set, device directory and secret record, and the token store that
// Authenticate reads and revocations come from. It is the one place that
// decides how such a copy stays right.
//
// Every start of the watch is a full read that replaces the copy whole, so
// a missed update or delete cannot leave it wrong. The watch is started
// again, with a full read, after any watch that ends, whatever the reason
// (its updates stop because nats.go gave up its consumer, the connection
// closed, a restarted NATS lost the bucket), after one that could not
// start, and whenever the owner asks (Resync, on a reconnect). Between two
// reads the copy keeps answering from what it last knew.
//
//	m := kvmirror.New(kv, log, kvmirror.Config[Relay]{OnChange: changed})
//	go m.Run(ctx)              // until ctx ends; the owner waits for it
//	err := m.Wait(ctx)         // the first full read
//	r, ok := m.Get("rl-1234")  // never waits for NATS
//
// A writer that knows the revision it wrote can Put the value at once, so
// that its own relay sees it before the watch echoes it back; a value is
// only ever replaced by one of a later revision.
package kvmirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// RetryDelay is how long a mirror waits before watching again after a watch
// that could not start or ended; a Resync makes the retry immediate.
const RetryDelay = time.Second

// Log attribute keys used by this package.
const (
	attrBucket = "bucket"
	attrKey    = "key"
	attrError  = "error"
)

// ErrWatchEnded is the cause recorded when a watch's updates stop while
// nobody asked it to end.
var ErrWatchEnded = errors.New("the bucket's watch ended")

// errResync ends a watch because a resync was asked for.
var errResync = errors.New("resync requested")

// Config says what a mirror watches and whom it tells. Every field is
// optional.
type Config[T any] struct {
	// Keys, if set, are the only keys watched; the bucket's other keys may
	// hold other things. By default every key is.
	Keys []string

	// Decode turns a stored value into a T. By default it is JSON. A value
	// it refuses is logged and counts as deleted.
	Decode func(key string, data []byte) (T, error)

	// OnReload, after each full read, gets the items the read replaced and
	// the new ones; OnApply, after each single change, the item before and
	// after it (old nil for an insert, new nil for a delete). Both run with
	// the mirror's lock held, in the order of the changes, to keep
	// something derived from the items current; they must neither block nor
	// call back into the mirror, and must not keep or change the maps.
	OnReload func(old, new map[string]T)
	OnApply  func(old, new *T)

	// OnChange is called after each full read and each change, once the
	// lock is released. It must not block.
	OnChange func()
}

// Mirror is a bucket's contents in memory, decoded into T, kept current by
// Run. It is safe for concurrent use.
type Mirror[T any] struct {
	kv     jetstream.KeyValue
	log    *slog.Logger
	cfg    Config[T]
	resync chan struct{} // asks Run to restart its watch; capacity 1
	ready  chan struct{} // closed by the first full read

	mu        sync.RWMutex // guards the fields below
	items     map[string]T
	revs      map[string]uint64 // revision of each item, and of each key seen deleted since the last full read
	fresh     map[string]T      // the full read under way, nil between reads
	freshRevs map[string]uint64
	loads     int   // how many full reads completed
	lastErr   error // why the last watch ended or could not start; nil while one runs
	failing   bool  // no full read completed since a watch ended or failed to start
}

// New returns a mirror of kv, empty until Run has read it. A nil logger
// discards.
func New[T any](kv jetstream.KeyValue, log *slog.Logger, cfg Config[T]) *Mirror[T] {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Decode == nil {
		cfg.Decode = decodeJSON[T]
	}
	return &Mirror[T]{
		kv: kv, log: log, cfg: cfg,
		resync: make(chan struct{}, 1),
		ready:  make(chan struct{}),
		items:  map[string]T{},
		revs:   map[string]uint64{},
	}
}

func decodeJSON[T any](_ string, data []byte) (T, error) {
	var v T
	err := json.Unmarshal(data, &v)
	return v, err
}

// Resync asks the mirror to read the whole bucket again.
func (m *Mirror[T]) Resync() {
	select {
	case m.resync <- struct{}{}:
	default: // already asked
	}
}

// Ready is closed once the first full read has completed.
func (m *Mirror[T]) Ready() <-chan struct{} { return m.ready }

// Wait waits for the first full read. If ctx ends first, the error wraps
// ctx's and, when a watch failed meanwhile, that failure too.
func (m *Mirror[T]) Wait(ctx context.Context) error {
	select {
	case <-m.ready:
		return nil
	case <-ctx.Done():
	}
	m.mu.RLock()
	last := m.lastErr
	m.mu.RUnlock()
	if last != nil {
		return fmt.Errorf("reading bucket %s: %w (the last watch: %w)", m.kv.Bucket(), ctx.Err(), last)
	}
	return fmt.Errorf("reading bucket %s: %w", m.kv.Bucket(), ctx.Err())
}

// Run watches the bucket until ctx ends, reading it whole at every start of
// the watch.
func (m *Mirror[T]) Run(ctx context.Context) {
	for ctx.Err() == nil {
		err := m.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		m.ended(err)
		if errors.Is(err, errResync) {
			continue // asked for: read again now
		}
		select {
		case <-ctx.Done():
			return
		case <-m.resync: // a resync makes the retry immediate
		case <-time.After(RetryDelay):
		}
	}
}

// ended records why a watch ended, and says so once per run of failures:
// a watch that cannot start is tried again every RetryDelay.
func (m *Mirror[T]) ended(err error) {
	resync := errors.Is(err, errResync)
	m.mu.Lock()
	m.fresh, m.freshRevs = nil, nil
	first := !resync && !m.failing
	if !resync {
		m.lastErr, m.failing = err, true
	}
	m.mu.Unlock()
	switch {
	case resync:
	case first:
		m.log.Warn("bucket watch ended or could not start; reading the bucket again as soon as a watch starts", attrBucket, m.kv.Bucket(), attrError, err)
	default:
		m.log.Debug("bucket watch could not start; trying again", attrBucket, m.kv.Bucket(), attrError, err)
	}
}

// watchOnce does one full read and then applies updates until the watch
// ends, ctx ends or a resync is asked for.
func (m *Mirror[T]) watchOnce(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.startRead() // before the watch, so that no Put falls between the two
	var w jetstream.KeyWatcher
	var err error
	if len(m.cfg.Keys) > 0 {
		// A copy: the client prefixes the keys it is given in place, and
		// the next watch would filter on the prefixed names.
		w, err = m.kv.WatchFiltered(wctx, slices.Clone(m.cfg.Keys))
	} else {
		w, err = m.kv.WatchAll(wctx)
	}
	if err != nil {
		return err
	}
	defer func() {
		_ = w.Stop()
		cancel()
		for range w.Updates() { // let the delivery goroutine finish
		}
	}()
	m.mu.Lock()
	m.lastErr = nil
	m.mu.Unlock()
	loading := true
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.resync:
			return errResync
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return ErrWatchEnded
			case e == nil && loading:
				loading = false
				m.finishRead()
			case e == nil:
			case loading:
				m.mu.Lock()
				m.decodeInto(m.fresh, m.freshRevs, e.Key(), e.Value(), e.Revision(), isDelete(e))
				m.mu.Unlock()
			default:
				m.apply(e.Key(), e.Value(), e.Revision(), isDelete(e))
			}
		}
	}
}

func isDelete(e jetstream.KeyValueEntry) bool {
	op := e.Operation()
	return op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge
}

// startRead begins collecting a full read.
func (m *Mirror[T]) startRead() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fresh, m.freshRevs = map[string]T{}, map[string]uint64{}
}

// finishRead replaces the items with the full read just completed.
func (m *Mirror[T]) finishRead() {
	m.mu.Lock()
	old := m.items
	m.items, m.revs = m.fresh, m.freshRevs
	m.fresh, m.freshRevs = nil, nil
	m.loads++
	first, recovered := m.loads == 1, m.failing
	m.failing = false
	if m.cfg.OnReload != nil {
		m.cfg.OnReload(old, m.items)
	}
	m.mu.Unlock()
	if first {
		close(m.ready)
	}
	if recovered {
		m.log.Info("bucket read again in full; its watch runs again", attrBucket, m.kv.Bucket())
	}
	m.changed()
}

// Put sets key to v as of revision rev, the answer to a write this process
// made, unless the mirror already holds a later revision of key. It reports
// whether v was applied.
func (m *Mirror[T]) Put(key string, v T, rev uint64) bool {
	m.mu.Lock()
	if m.fresh != nil && rev > m.freshRevs[key] { // the read under way must not lose it
		m.fresh[key], m.freshRevs[key] = v, rev
	}
	applied := m.setLocked(key, &v, rev)
	m.mu.Unlock()
	if applied {
		m.changed()
	}
	return applied
}

// apply applies one watched change of key.
func (m *Mirror[T]) apply(key string, data []byte, rev uint64, deleted bool) {
	var v *T
	if !deleted {
		if d, err := m.cfg.Decode(key, data); err != nil {
			m.log.Warn("ignoring a malformed record", attrBucket, m.kv.Bucket(), attrKey, key, attrError, err)
		} else {
			v = &d
		}
	}
	m.mu.Lock()
	applied := m.setLocked(key, v, rev)
	m.mu.Unlock()
	if applied {
		m.changed()
	}
}

// setLocked sets key to v (nil: deleted) at rev unless a later revision of
// key is held, and tells OnApply.
func (m *Mirror[T]) setLocked(key string, v *T, rev uint64) bool {
	if known, seen := m.revs[key]; seen && known >= rev {
		return false
	}
	old, had := m.items[key]
	m.revs[key] = rev
	if v == nil {
		delete(m.items, key)
	} else {
		m.items[key] = *v
	}
	if m.cfg.OnApply != nil {
		var op *T
		if had {
			op = &old
		}
		m.cfg.OnApply(op, v)
	}
	return true
}

// decodeInto records one entry of a full read.
func (m *Mirror[T]) decodeInto(items map[string]T, revs map[string]uint64, key string, data []byte, rev uint64, deleted bool) {
	if known, seen := revs[key]; seen && known >= rev {
		return // a Put got there first
	}
	revs[key] = rev
	if deleted {
		delete(items, key)
		return
	}
	v, err := m.cfg.Decode(key, data)
	if err != nil {
		m.log.Warn("ignoring a malformed record", attrBucket, m.kv.Bucket(), attrKey, key, attrError, err)
		delete(items, key)
		return
	}
	items[key] = v
}

func (m *Mirror[T]) changed() {
	if m.cfg.OnChange != nil {
		m.cfg.OnChange()
	}
}

// Get returns the item under key.
func (m *Mirror[T]) Get(key string) (T, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.items[key]
	return v, ok
}

// Record returns the item under key with its revision, a starting point
// for a compare-and-set; a key the mirror holds no item under gives the
// zero T and revision 0.
func (m *Mirror[T]) Record(key string) (v T, rev uint64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.items[key]
	if !ok {
		return v, 0
	}
	return v, m.revs[key]
}

// Seen reports whether the mirror holds key or saw it deleted (or
// malformed) since its last full read, or in it.
func (m *Mirror[T]) Seen(key string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, seen := m.revs[key]
	return seen
}

// All returns a copy of every item.
func (m *Mirror[T]) All() []T {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]T, 0, len(m.items))
	for _, v := range m.items {
		out = append(out, v)
	}
	return out
}

// Range calls fn for each item, in no order, with the mirror's read lock
// held, until fn returns false: a scan without a copy. fn must not call
// back into the mirror.
func (m *Mirror[T]) Range(fn func(v T) bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, v := range m.items {
		if !fn(v) {
			return
		}
	}
}

// Status reports whether a full read has completed, and how many have.
func (m *Mirror[T]) Status() (synced bool, loads int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.loads > 0, m.loads
}
