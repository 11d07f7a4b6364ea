package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// mirrorRetry is how long a mirror waits before watching again after the
// watch could not start or ended.
const mirrorRetry = time.Second

// mirror keeps a whole bucket in memory, decoded from JSON into T, fed by a
// watch. Every (re)start of the watch is a full read that replaces the map,
// so a missed update or delete cannot leave it inconsistent: after any gap
// (a lost NATS connection, a watch that ended) it resyncs.
type mirror[T any] struct {
	kv       jetstream.KeyValue
	log      *slog.Logger
	onChange func() // called after each applied change; must not block

	resync chan struct{} // asks the loop to restart its watch

	// keys, if set before run, are the only keys watched; the others of
	// the bucket may hold other things.
	keys []string

	// onReload and onApply, if set, keep something derived from the items
	// current: onReload after a full read, onApply after each change (old
	// or new nil for an insert or a delete). Both run with the mirror's
	// lock held and must not call back into it.
	onReload func(items map[string]T)
	onApply  func(old, new *T)

	mu     sync.RWMutex
	items  map[string]T
	revs   map[string]uint64 // each item's revision
	synced bool              // a full read has completed at least once
	loads  int               // how many full reads completed
}

func newMirror[T any](kv jetstream.KeyValue, log *slog.Logger, onChange func()) *mirror[T] {
	if onChange == nil {
		onChange = func() {}
	}
	return &mirror[T]{kv: kv, log: log, onChange: onChange, resync: make(chan struct{}, 1), items: map[string]T{}, revs: map[string]uint64{}}
}

// Resync asks the mirror to read the whole bucket again.
func (m *mirror[T]) Resync() {
	select {
	case m.resync <- struct{}{}:
	default:
	}
}

// run watches the bucket until ctx ends.
func (m *mirror[T]) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := m.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			m.log.Debug("bucket watch ended; reading it again", "bucket", m.kv.Bucket(), "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-m.resync: // a resync request makes the retry immediate
		case <-time.After(mirrorRetry):
		}
	}
}

// errResync ends a watch because a resync was asked for.
var errResync = errors.New("resync requested")

// watchOnce does one full read and then applies updates until the watch
// ends, ctx ends or a resync is asked for.
func (m *mirror[T]) watchOnce(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var w jetstream.KeyWatcher
	var err error
	if len(m.keys) > 0 {
		w, err = m.kv.WatchFiltered(wctx, m.keys)
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
	fresh, freshRevs := map[string]T{}, map[string]uint64{}
	loading := true
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.resync:
			return errResync
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch closed")
			}
			switch {
			case e == nil && loading:
				loading = false
				m.mu.Lock()
				m.items, m.revs, m.synced = fresh, freshRevs, true
				m.loads++
				if m.onReload != nil {
					m.onReload(fresh)
				}
				m.mu.Unlock()
				m.onChange()
			case e == nil:
			case loading:
				m.decodeInto(fresh, freshRevs, e)
			default:
				m.mu.Lock()
				old, had := m.items[e.Key()]
				m.decodeInto(m.items, m.revs, e)
				if m.onApply != nil {
					nw, has := m.items[e.Key()]
					m.onApply(ptrIf(old, had), ptrIf(nw, has))
				}
				m.mu.Unlock()
				m.onChange()
			}
		}
	}
}

// decodeInto applies the entry e to items and revs.
func (m *mirror[T]) decodeInto(items map[string]T, revs map[string]uint64, e jetstream.KeyValueEntry) {
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		delete(items, e.Key())
		delete(revs, e.Key())
		return
	}
	var v T
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		m.log.Warn("ignoring a malformed record", "bucket", m.kv.Bucket(), "key", e.Key(), "error", err)
		delete(items, e.Key())
		delete(revs, e.Key())
		return
	}
	items[e.Key()] = v
	revs[e.Key()] = e.Revision()
}

func ptrIf[T any](v T, ok bool) *T {
	if !ok {
		return nil
	}
	return &v
}

// get returns the item under key.
func (m *mirror[T]) get(key string) (T, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.items[key]
	return v, ok
}

// record returns the item under key with its revision, as a starting
// point for a compare-and-set (updateFrom); a key the mirror does not hold
// gives revision 0.
func (m *mirror[T]) record(key string) *record[T] {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return &record[T]{val: m.items[key], rev: m.revs[key]}
}

// all returns a copy of every item.
func (m *mirror[T]) all() []T {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]T, 0, len(m.items))
	for _, v := range m.items {
		out = append(out, v)
	}
	return out
}

// status reports whether a full read has completed, and how many have.
func (m *mirror[T]) status() (synced bool, loads int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.synced, m.loads
}
