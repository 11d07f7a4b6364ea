package fleetsecret

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/secret"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// RecordKey is the key of the Record in fleet.BucketFleet.
const RecordKey = "fleet_secret"

// RecordFormat is the format of Record this version reads and writes.
const RecordFormat = 1

// MaxSecrets bounds the secrets a record accepts at once: the signing one,
// one being rotated in, and old ones kept for their grace.
const MaxSecrets = 8

// Record is the fleet secret in fleet.BucketFleet, as JSON, under
// RecordKey: the secret relays sign forwards (and access codes) with and
// every secret they accept. Relays that run from it watch it and apply
// each change at once; a rotation changes it in two phases (see Rotation).
type Record struct {
	Format int `json:"format"`
	// Generation counts the changes of the record: each write adds one.
	Generation uint64 `json:"generation"`
	// Signing is the fingerprint of the secret relays sign with.
	Signing string `json:"signing"`
	// Secrets are every accepted secret, the signing one among them.
	Secrets []StoredSecret `json:"secrets"`
	// Rotation is the rotation in progress, nil when there is none: kept
	// here so that an interrupted rotation resumes from any machine.
	Rotation  *Rotation `json:"rotation,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"` // a relay id, or who ran the rotation
}

// StoredSecret is one secret of a Record.
type StoredSecret struct {
	Fingerprint string    `json:"fingerprint"`
	Secret      []byte    `json:"secret"` // base64 in JSON
	AddedAt     time.Time `json:"added_at"`
	// RetireAt, when set, is when housekeeping drops this secret: an old
	// signing secret kept accepted for a grace after a rotation.
	RetireAt time.Time `json:"retire_at,omitzero"`
}

// newRecord returns a first record that signs with s.
func newRecord(s []byte, by string) Record {
	t := now()
	fp := secret.Fingerprint(s)
	return Record{
		Format: RecordFormat, Generation: 1, Signing: fp,
		Secrets:   []StoredSecret{{Fingerprint: fp, Secret: s, AddedAt: t}},
		UpdatedAt: t, UpdatedBy: by,
	}
}

// validate rejects a record this relay cannot run from.
func (r *Record) validate() error {
	if r.Format != RecordFormat {
		return fmt.Errorf("the stored fleet secret has format %d; this version reads format %d", r.Format, RecordFormat)
	}
	seen := map[string]bool{}
	for _, s := range r.Secrets {
		if len(s.Secret) < secret.MinBytes {
			return fmt.Errorf("the stored fleet secret %s has %d bytes, fewer than %d", s.Fingerprint, len(s.Secret), secret.MinBytes)
		}
		if secret.Fingerprint(s.Secret) != s.Fingerprint {
			return fmt.Errorf("the stored fleet secret %s does not match its fingerprint", s.Fingerprint)
		}
		seen[s.Fingerprint] = true
	}
	if !seen[r.Signing] {
		return fmt.Errorf("the stored fleet secret signs with %s, which it does not hold", r.Signing)
	}
	if r.Rotation != nil && (!seen[r.Rotation.To] || r.Rotation.Phase != RotationAccept && r.Rotation.Phase != RotationSign) {
		return fmt.Errorf("the stored fleet secret's rotation (%s to %s, phase %q) is malformed", r.Rotation.From, r.Rotation.To, r.Rotation.Phase)
	}
	return nil
}

// keys returns the signing secret and the other accepted ones.
func (r *Record) keys() (signing []byte, others [][]byte) {
	for _, s := range r.Secrets {
		if s.Fingerprint == r.Signing {
			signing = s.Secret
		} else {
			others = append(others, s.Secret)
		}
	}
	return signing, others
}

// fingerprints returns the fingerprints of the accepted secrets, the
// signing one first, as a Ring of the record lists them.
func (r *Record) fingerprints() []string {
	out := []string{r.Signing}
	for _, s := range r.Secrets {
		if s.Fingerprint != r.Signing {
			out = append(out, s.Fingerprint)
		}
	}
	return out
}

// secretOf returns the stored secret with fingerprint fp.
func (r *Record) secretOf(fp string) ([]byte, bool) {
	for _, s := range r.Secrets {
		if s.Fingerprint == fp {
			return s.Secret, true
		}
	}
	return nil, false
}

// loadRecord reads the fleet secret record, creating it with a new random
// secret on first use; the first relay to create it wins, and every relay
// reads the same one.
func loadRecord(ctx context.Context, kv jetstream.KeyValue, by string) (rec Record, created bool, err error) {
	for range maxAttempts {
		e, err := kv.Get(ctx, RecordKey)
		switch {
		case err == nil:
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				return rec, false, fmt.Errorf("the stored fleet secret %s/%s is malformed: %w", kv.Bucket(), RecordKey, err)
			}
			return rec, false, rec.validate()
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return rec, false, fmt.Errorf("reading the fleet secret: %w", err)
		}
		rec = newRecord(secret.New(), by)
		data, err := json.Marshal(rec)
		if err != nil {
			return rec, false, err
		}
		if _, err := kv.Create(ctx, RecordKey, data); err == nil {
			return rec, true, nil
		} else if !isConflict(err) {
			return rec, false, fmt.Errorf("storing the fleet secret: %w", err)
		}
	}
	return rec, false, fmt.Errorf("fleet secret: %w", fleet.ErrConflict)
}

// updateRecord applies change to the stored record with compare-and-set,
// retrying when another writer got there first. change receives the record
// (found false when there is none) and says whether to write it.
func updateRecord(ctx context.Context, kv jetstream.KeyValue, change func(cur *Record, found bool) (write bool, err error)) (Record, error) {
	for range maxAttempts {
		var cur Record
		var rev uint64
		e, err := kv.Get(ctx, RecordKey)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return Record{}, err
		default:
			if err := json.Unmarshal(e.Value(), &cur); err != nil {
				return Record{}, fmt.Errorf("record %s/%s is malformed: %w", kv.Bucket(), RecordKey, err)
			}
			rev = e.Revision()
		}
		write, err := change(&cur, rev != 0)
		if err != nil || !write {
			return cur, err
		}
		data, err := json.Marshal(cur)
		if err != nil {
			return Record{}, err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, RecordKey, data)
		} else {
			_, err = kv.Update(ctx, RecordKey, data, rev)
		}
		if err == nil {
			return cur, nil
		}
		if !isConflict(err) {
			return Record{}, err
		}
	}
	return Record{}, fmt.Errorf("%s/%s: %w", kv.Bucket(), RecordKey, fleet.ErrConflict)
}

// openRecord makes the ring run the stored record, creating it on first use.
func (k *Keeper) openRecord(ctx context.Context) error {
	rec, created, err := loadRecord(ctx, k.kv, k.cfg.RelayID)
	if err != nil {
		return err
	}
	signing, others := rec.keys()
	if k.ring, err = secret.NewRing(signing, others...); err != nil {
		return err
	}
	k.loop.applied = rec
	if created {
		k.log.Info("stored the fleet secret", logkey.Fingerprint, rec.Signing)
	}
	return nil
}

// stored returns the stored record as the mirror has it, or nil.
func (k *Keeper) stored() *Record {
	if r, ok := k.rec.Get(RecordKey); ok {
		return &r
	}
	return nil
}
