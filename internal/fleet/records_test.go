package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/kvmirror"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// countingKV counts the reads of a bucket.
type countingKV struct {
	jetstream.KeyValue
	gets int
}

func (c *countingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	c.gets++
	return c.KeyValue.Get(ctx, key)
}

type counter struct{ N int }

// TestUpdateFromHint: a current copy saves the read; a stale one costs a
// read and still gives the right record, also when the copy says there is
// nothing to write.
func TestUpdateFromHint(t *testing.T) {
	ctx := testContext(t)
	st, err := store.Open(ctx, store.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	raw, err := st.JetStream().CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "hints"})
	if err != nil {
		t.Fatal(err)
	}
	kv := &countingKV{KeyValue: raw}
	// set makes the record N = n, writing only when it differs.
	set := func(n int) func(counter, bool) (counter, bool, error) {
		return func(cur counter, _ bool) (counter, bool, error) {
			return counter{N: n}, cur.N != n, nil
		}
	}
	current := func() *record[counter] {
		e, err := raw.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		var c counter
		json.Unmarshal(e.Value(), &c)
		return &record[counter]{val: c, rev: e.Revision()}
	}

	steps := []struct {
		name    string
		hint    func() *record[counter]
		n, gets int
	}{
		{"no record, and the copy knows", func() *record[counter] { return &record[counter]{} }, 1, 0},
		{"a current copy", current, 2, 0},
		{"a stale copy", func() *record[counter] { h := current(); h.rev--; return h }, 3, 1},
		{"a stale copy that sees nothing to write", func() *record[counter] { h := current(); h.val.N = 4; h.rev--; return h }, 4, 1},
		{"no copy", func() *record[counter] { return nil }, 5, 1},
	}
	for _, s := range steps {
		kv.gets = 0
		got, err := updateFrom(ctx, kv, "k", s.hint(), set(s.n))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got.N != s.n || current().val.N != s.n {
			t.Errorf("%s: returned %d, stored %d, want %d", s.name, got.N, current().val.N, s.n)
		}
		if kv.gets != s.gets {
			t.Errorf("%s: %d reads, want %d", s.name, kv.gets, s.gets)
		}
	}
}

// TestUpdateFromPutsItsWrites: what updateFrom writes enters the hint's
// mirror at once, so that the next write of the key starts from it without
// a read, before any watch has echoed it (this mirror runs no watch).
func TestUpdateFromPutsItsWrites(t *testing.T) {
	ctx := testContext(t)
	st, err := store.Open(ctx, store.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	raw, err := st.JetStream().CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "puts"})
	if err != nil {
		t.Fatal(err)
	}
	kv := &countingKV{KeyValue: raw}
	m := kvmirror.New[counter](raw, nil, kvmirror.Config[counter]{})
	for n := 1; n <= 3; n++ {
		if _, err := updateFrom(ctx, kv, "k", hint(m, "k"), func(counter, bool) (counter, bool, error) {
			return counter{N: n}, true, nil
		}); err != nil {
			t.Fatal(err)
		}
		got, rev := m.Record("k")
		if got.N != n || rev != uint64(n) {
			t.Errorf("write %d: the mirror holds %d at revision %d", n, got.N, rev)
		}
	}
	if kv.gets != 0 {
		t.Errorf("%d reads, want none: each write started from the one before", kv.gets)
	}
}

// TestRelayIDFromName: a name gives one valid relay id, the same every time;
// other names give others.
func TestRelayIDFromName(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"switchboard/switchboard-0", "switchboard/switchboard-1", "other/switchboard-0", "relay-a.example.com", "x"} {
		id := RelayIDFromName(name)
		if !ValidRelayID(id) {
			t.Errorf("RelayIDFromName(%q) = %q, not a relay id", name, id)
		}
		if again := RelayIDFromName(name); again != id {
			t.Errorf("RelayIDFromName(%q) gave %q, then %q", name, id, again)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%q and %q both give %q", name, other, id)
		}
		seen[id] = name
	}
}

// TestIsConflict: a lost compare-and-set is a conflict whichever code the
// stream reports it with (a single server 10071, a replicated stream 10164),
// as nats.go's KV hands them back; other API errors are not.
func TestIsConflict(t *testing.T) {
	single := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}
	replicated := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("nats: %w: %w", single, jetstream.ErrKeyRevisionMismatch), true},
		{fmt.Errorf("nats: %w: %w", replicated, jetstream.ErrKeyRevisionMismatch), true},
		{fmt.Errorf("create: %w", jetstream.ErrKeyExists), true},
		{single, true}, // a publish's answer, unwrapped
		{fmt.Errorf("attach: %w", replicated), true},
		{&jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeJetStreamNotEnabled}, false},
		{jetstream.ErrNoStreamResponse, false},
	} {
		if got := isConflict(tt.err); got != tt.want {
			t.Errorf("isConflict(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
