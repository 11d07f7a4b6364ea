package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/kvmirror"
)

// maxAttempts bounds the retries of a compare-and-set that loses to another
// writer.
const maxAttempts = 8

// update applies change to the JSON record under key with compare-and-set,
// retrying when another writer got there first. change receives the current
// record (found=false when there is none) and returns the record to write, or
// write=false to leave the bucket as it is. It returns the record as written
// (or as found, when nothing was written).
func update[T any](ctx context.Context, kv jetstream.KeyValue, key string, change func(cur T, found bool) (next T, write bool, err error)) (T, error) {
	return updateFrom(ctx, kv, key, nil, change)
}

// record is a value of a bucket with the revision it was read at (0: the
// key had no value), and the mirror it was read from, if any.
type record[T any] struct {
	val    T
	rev    uint64
	mirror *kvmirror.Mirror[T]
}

// hint returns the record under key as the mirror m holds it, a starting
// point for updateFrom, which puts what it writes into m.
func hint[T any](m *kvmirror.Mirror[T], key string) *record[T] {
	v, rev := m.Record(key)
	return &record[T]{val: v, rev: rev, mirror: m}
}

// updateFrom is update whose first compare-and-set starts from hint, a
// copy of the record kept by a watch, instead of reading it: one round
// trip instead of two when the copy is current and change writes. A stale
// copy costs a lost compare-and-set, after which the record is read as in
// update; a decision not to write (or an error) taken on the copy is taken
// again on the record read. What it writes enters the hint's mirror at
// once, before the watch echoes it: this relay's next decision about the
// key starts from its own write, not from a copy that lost to it.
func updateFrom[T any](ctx context.Context, kv jetstream.KeyValue, key string, hint *record[T], change func(cur T, found bool) (next T, write bool, err error)) (T, error) {
	var zero T
	for attempt := range maxAttempts {
		var cur T
		var rev uint64
		if attempt == 0 && hint != nil {
			cur, rev = hint.val, hint.rev
		} else {
			e, err := kv.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
			case err != nil:
				return zero, err
			default:
				if err := json.Unmarshal(e.Value(), &cur); err != nil {
					return zero, fmt.Errorf("record %s/%s is malformed: %w", kv.Bucket(), key, err)
				}
				rev = e.Revision()
			}
		}
		next, write, err := change(cur, rev != 0)
		if hinted := attempt == 0 && hint != nil; hinted && (err != nil || !write) {
			continue // decided on a copy that may be stale: read the record and decide again
		}
		if err != nil || !write {
			return next, err
		}
		data, err := json.Marshal(next)
		if err != nil {
			return zero, err
		}
		var wrote uint64
		if rev == 0 {
			wrote, err = kv.Create(ctx, key, data)
		} else {
			wrote, err = kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			if hint != nil && hint.mirror != nil {
				hint.mirror.Put(key, next, wrote)
			}
			return next, nil
		}
		if !isConflict(err) {
			return zero, err
		}
	}
	return zero, fmt.Errorf("%s/%s: %w", kv.Bucket(), key, ErrConflict)
}

// isConflict reports whether err is a lost compare-and-set: a Create of a
// key that exists, or an Update from a revision that is no longer the
// key's. Replicated streams (a NATS cluster, --nats-replicas 3) report the
// second with another code than a single server; ErrKeyRevisionMismatch
// covers both.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var api *jetstream.APIError // a publish's answer, as ClaimPromoted's writes get it
	return errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
