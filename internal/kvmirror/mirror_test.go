package kvmirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var eventually = testkit.Eventually

type item struct {
	N int `json:"n"`
}

func testContext(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// bucket opens a bucket on a fresh embedded NATS server.
func bucket(t *testing.T) (*store.Store, jetstream.KeyValue) {
	t.Helper()
	st, err := store.Open(testContext(t), store.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	kv, err := st.KeyValue(testContext(t), "test")
	if err != nil {
		t.Fatal(err)
	}
	return st, kv
}

// changes records what a mirror's hooks were told.
type changes struct {
	mu      sync.Mutex // guards the fields below
	reloads []reload
	applies int
	changed int
}

type reload struct{ old, new map[string]item }

func (c *changes) config() Config[item] {
	return Config[item]{
		OnReload: func(old, new map[string]item) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.reloads = append(c.reloads, reload{maps.Clone(old), maps.Clone(new)})
		},
		OnApply: func(_, _ *item) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.applies++
		},
		OnChange: func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.changed++
		},
	}
}

// start runs m until the test ends and waits for its first full read.
func start[T any](t *testing.T, m *Mirror[T]) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	if err := m.Wait(testContext(t)); err != nil {
		t.Fatal(err)
	}
}

func put(t *testing.T, kv jetstream.KeyValue, key string, n int) uint64 {
	t.Helper()
	rev, err := kv.Put(testContext(t), key, fmt.Appendf(nil, `{"n":%d}`, n))
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func holds(m *Mirror[item], want map[string]int) error {
	held := 0
	m.Range(func(item) bool {
		held++
		return true
	})
	for k, n := range want {
		if v, ok := m.Get(k); !ok || v.N != n {
			return fmt.Errorf("%s is %+v (held %v), want %d", k, v, ok, n)
		}
	}
	if held != len(want) || len(m.All()) != len(want) {
		return fmt.Errorf("the mirror holds %d items, want %d", held, len(want))
	}
	return nil
}

func TestReadsTheBucketAndFollowsIt(t *testing.T) {
	_, kv := bucket(t)
	put(t, kv, "a", 1)
	put(t, kv, "b", 2)
	var c changes
	m := New(kv, nil, c.config())
	start(t, m)
	if err := holds(m, map[string]int{"a": 1, "b": 2}); err != nil {
		t.Fatalf("after the first read: %v", err)
	}
	put(t, kv, "c", 3)
	put(t, kv, "a", 4)
	if err := kv.Delete(testContext(t), "b"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error { return holds(m, map[string]int{"a": 4, "c": 3}) })
	if !m.Seen("b") || m.Seen("nothing") {
		t.Error("Seen does not tell a deleted key from an unknown one")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.reloads) != 1 || c.applies != 3 || c.changed != 4 {
		t.Errorf("hooks told %d reloads, %d applies, %d changes; want 1, 3, 4", len(c.reloads), c.applies, c.changed)
	}
	if synced, loads := m.Status(); !synced || loads != 1 {
		t.Errorf("Status = %v, %d; want true, 1", synced, loads)
	}
}

// TestReadsTheBucketAgainWhenItsWatchEnds ends the watch from outside and
// keeps a new one from starting while the bucket changes: the mirror then
// reads the bucket whole and tells OnReload what it held before.
func TestReadsTheBucketAgainWhenItsWatchEnds(t *testing.T) {
	_, kv := bucket(t)
	put(t, kv, "a", 1)
	put(t, kv, "b", 2)
	tap := testkit.NewKVTap(kv)
	var c changes
	logs := &testkit.Buffer{}
	m := New[item](tap, slog.New(slog.NewTextHandler(logs, nil)), c.config())
	start(t, m)

	tap.EndWatches()
	put(t, kv, "c", 3)
	if err := kv.Delete(testContext(t), "a"); err != nil {
		t.Fatal(err)
	}
	if err := holds(m, map[string]int{"a": 1, "b": 2}); err != nil {
		t.Fatalf("without a watch: %v", err)
	}
	tap.Release()
	eventually(t, 3*RetryDelay, func() error { return holds(m, map[string]int{"b": 2, "c": 3}) })
	if ended, again := logs.Count("bucket watch ended"), logs.Count("bucket read again"); ended != 1 || again != 1 {
		t.Errorf("%d lines say the watch ended and %d that the bucket was read again, want 1 each:\n%s", ended, again, logs)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.reloads) != 2 {
		t.Fatalf("%d full reads, want 2", len(c.reloads))
	}
	r := c.reloads[1]
	if !slices.Equal(slices.Sorted(maps.Keys(r.old)), []string{"a", "b"}) || !slices.Equal(slices.Sorted(maps.Keys(r.new)), []string{"b", "c"}) {
		t.Errorf("the second read replaced %v with %v", r.old, r.new)
	}
}

func TestResyncReadsAtOnce(t *testing.T) {
	_, kv := bucket(t)
	m := New[item](kv, nil, Config[item]{})
	start(t, m)
	m.Resync()
	eventually(t, RetryDelay/2, func() error {
		if _, loads := m.Status(); loads != 2 {
			return fmt.Errorf("%d full reads", loads)
		}
		return nil
	})
}

// TestPutKeepsTheLatestRevision: a value this process wrote is held at
// once, an older revision never replaces a newer one, and a write Put and
// watched is applied once.
func TestPutKeepsTheLatestRevision(t *testing.T) {
	_, kv := bucket(t)
	tap := testkit.NewKVTap(kv)
	var c changes
	m := New[item](tap, nil, c.config())
	start(t, m)

	tap.EndWatches() // the write's answer comes before any watch sees it
	rev := put(t, kv, "a", 1)
	if !m.Put("a", item{N: 1}, rev) {
		t.Fatal("Put of a write's answer was not applied")
	}
	if m.Put("a", item{N: 0}, rev-1) {
		t.Fatal("Put of an older revision was applied")
	}
	tap.Release()
	eventually(t, 3*RetryDelay, func() error {
		if _, loads := m.Status(); loads != 2 {
			return fmt.Errorf("%d full reads", loads)
		}
		return nil
	})
	rev2 := put(t, kv, "a", 2)
	eventually(t, 5*time.Second, func() error { return holds(m, map[string]int{"a": 2}) })
	if m.Put("a", item{N: 1}, rev) {
		t.Fatal("Put of a revision older than the watch's was applied")
	}
	if v, r := m.Record("a"); v.N != 2 || r != rev2 {
		t.Errorf("Record = %+v at %d, want 2 at %d", v, r, rev2)
	}

	// Put and the watch race for a write: whichever comes second changes nothing.
	m.Put("b", item{N: 3}, put(t, kv, "b", 3))
	put(t, kv, "z", 4) // watched after b
	eventually(t, 5*time.Second, func() error { return holds(m, map[string]int{"a": 2, "b": 3, "z": 4}) })
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.applies != 4 {
		t.Errorf("%d changes applied, want 4: a's Put, a's second write, b once, z", c.applies)
	}
}

func TestMalformedValuesCountAsDeleted(t *testing.T) {
	_, kv := bucket(t)
	if _, err := kv.Put(testContext(t), "bad", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	m := New[item](kv, nil, Config[item]{
		Decode: func(key string, data []byte) (item, error) {
			if key == "refused" {
				return item{}, errors.New("refused by the decoder")
			}
			return decodeJSON[item](key, data)
		},
	})
	start(t, m)
	put(t, kv, "refused", 1)
	put(t, kv, "good", 2)
	eventually(t, 5*time.Second, func() error { return holds(m, map[string]int{"good": 2}) })
	if !m.Seen("bad") || !m.Seen("refused") {
		t.Error("a malformed value is not seen")
	}
	if _, rev := m.Record("bad"); rev != 0 {
		t.Errorf("Record of a malformed value gives revision %d, want 0", rev)
	}
}

func TestKeysLimitTheWatch(t *testing.T) {
	_, kv := bucket(t)
	put(t, kv, "mine", 1)
	put(t, kv, "other", 2)
	m := New[item](kv, nil, Config[item]{Keys: []string{"mine"}})
	start(t, m)
	if err := holds(m, map[string]int{"mine": 1}); err != nil {
		t.Fatal(err)
	}
}

// TestKeysWatchAgainWhenItEnds: a mirror limited to keys starts its watch
// again after it ended, as one of the whole bucket does (the watch must
// not be handed a slice it may rewrite: the client prefixes the keys in
// place).
func TestKeysWatchAgainWhenItEnds(t *testing.T) {
	_, kv := bucket(t)
	put(t, kv, "mine", 1)
	tap := testkit.NewKVTap(kv)
	m := New[item](tap, nil, Config[item]{Keys: []string{"mine"}})
	start(t, m)
	for i := range 2 {
		tap.EndWatches()
		put(t, kv, "mine", i+2)
		tap.Release()
		eventually(t, 3*RetryDelay, func() error { return holds(m, map[string]int{"mine": i + 2}) })
	}
	if synced, loads := m.Status(); !synced || loads != 3 {
		t.Errorf("Status = %v, %d; want true, 3", synced, loads)
	}
}

// TestWaitSaysWhyTheReadFails: a mirror of a bucket that is gone keeps
// trying, and Wait names the failure when its context ends.
func TestWaitSaysWhyTheReadFails(t *testing.T) {
	st, kv := bucket(t)
	if err := st.JetStream().DeleteStream(testContext(t), "KV_test"); err != nil {
		t.Fatal(err)
	}
	m := New[item](kv, nil, Config[item]{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	wctx, wcancel := context.WithTimeout(context.Background(), RetryDelay/4)
	defer wcancel()
	err := m.Wait(wctx)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, nats.ErrStreamNotFound) {
		t.Fatalf("Wait = %v, want the deadline and the missing stream", err)
	}
}
