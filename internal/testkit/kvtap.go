package testkit

import (
	"context"
	"errors"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrWatchesHeld is the error of a watch started while a KVTap holds them.
var ErrWatchesHeld = errors.New("testkit: the test holds this bucket's watches")

// KVTap is a key-value bucket whose watches a test can end from outside,
// as nats.go ends a watch whose consumer it gave up (its stream lost with
// a NATS that restarted empty, a consumer it could not create again), and
// hold back for a while. Everything else goes to the bucket it wraps.
type KVTap struct {
	jetstream.KeyValue

	mu       sync.Mutex // guards the fields below
	watchers []jetstream.KeyWatcher
	started  int
	held     bool
}

// NewKVTap wraps kv.
func NewKVTap(kv jetstream.KeyValue) *KVTap { return &KVTap{KeyValue: kv} }

// Watch starts a watch of keys unless watches are held.
func (k *KVTap) Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return k.start(func() (jetstream.KeyWatcher, error) { return k.KeyValue.Watch(ctx, keys, opts...) })
}

// WatchAll starts a watch of every key unless watches are held.
func (k *KVTap) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return k.start(func() (jetstream.KeyWatcher, error) { return k.KeyValue.WatchAll(ctx, opts...) })
}

// WatchFiltered starts a watch of keys unless watches are held.
func (k *KVTap) WatchFiltered(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return k.start(func() (jetstream.KeyWatcher, error) { return k.KeyValue.WatchFiltered(ctx, keys, opts...) })
}

func (k *KVTap) start(watch func() (jetstream.KeyWatcher, error)) (jetstream.KeyWatcher, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held {
		return nil, ErrWatchesHeld
	}
	w, err := watch()
	if err == nil {
		k.watchers = append(k.watchers, w)
		k.started++
	}
	return w, err
}

// EndWatches stops every watch started so far, which closes their Updates
// channels, and holds new ones back until Release.
func (k *KVTap) EndWatches() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.held = true
	for _, w := range k.watchers {
		_ = w.Stop()
	}
	k.watchers = nil
}

// Release lets watches start again.
func (k *KVTap) Release() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.held = false
}

// Started returns how many watches have started.
func (k *KVTap) Started() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.started
}
