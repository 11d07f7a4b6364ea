package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// leaseHousekeeping is the key of the housekeeping lease in BucketLeases.
const leaseHousekeeping = "housekeeping"

// lease is a lease's record: who holds it until when. A holder renews it
// well before it expires; anyone may take it once it has expired. Holders
// compare their own clocks with ExpiresAt, so the fleet's clocks should
// agree to well under the lease's length (NTP does).
type lease struct {
	Holder    string    `json:"holder"`
	ExpiresAt time.Time `json:"expires_at"`
}

// acquireLease takes or renews the lease name for holder for ttl. It reports
// whether holder holds it now and, if not, who does.
func acquireLease(ctx context.Context, kv jetstream.KeyValue, name, holder string, ttl time.Duration) (held bool, other string, err error) {
	e, err := kv.Get(ctx, name)
	var cur lease
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		e = nil
	case err != nil:
		return false, "", err
	default:
		if err := json.Unmarshal(e.Value(), &cur); err != nil {
			cur = lease{} // a malformed lease is an expired one
		}
	}
	t := time.Now()
	if e != nil && cur.Holder != holder && t.Before(cur.ExpiresAt) {
		return false, cur.Holder, nil
	}
	data, err := json.Marshal(lease{Holder: holder, ExpiresAt: t.Add(ttl).UTC()})
	if err != nil {
		return false, "", err
	}
	if e == nil {
		_, err = kv.Create(ctx, name, data)
	} else {
		_, err = kv.Update(ctx, name, data, e.Revision())
	}
	if isConflict(err) {
		return false, "", nil // someone else took it first; try again next round
	}
	if err != nil {
		return false, "", err
	}
	return true, holder, nil
}

// releaseLease gives the lease up if holder still holds it, so that another
// node can take it at once instead of waiting for it to expire.
func releaseLease(ctx context.Context, kv jetstream.KeyValue, name, holder string) error {
	e, err := kv.Get(ctx, name)
	if err != nil {
		return err
	}
	var cur lease
	if json.Unmarshal(e.Value(), &cur) != nil || cur.Holder != holder {
		return nil
	}
	return kv.Delete(ctx, name, jetstream.LastRevision(e.Revision()))
}
