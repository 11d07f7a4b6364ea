package auth

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/kvmirror"
)

// Log attribute keys used by this package. Secrets are never logged.
const (
	attrComponent = "component"
	attrTokenID   = "token_id"
	attrKind      = "kind"
	attrName      = "name"
	attrPath      = "path"
	attrError     = "error"
)

// maxAttempts bounds retries of id collisions and compare-and-set conflicts.
const maxAttempts = 5

// record is a token as stored in the bucket, as JSON, under its id.
type record struct {
	ID           string    `json:"id"`
	Kind         Kind      `json:"kind"`
	Name         string    `json:"name,omitempty"`
	Devices      []string  `json:"devices,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	SecretSHA256 string    `json:"secret_sha256"` // hex
	Revoked      bool      `json:"revoked,omitempty"`
	RevokedAt    time.Time `json:"revoked_at,omitzero"`
}

// cached is a decoded record as the in-memory copy keeps it.
type cached struct {
	tok  Token
	hash secretHash
}

// active reports whether c is a token that lets its bearer in.
func (c *cached) active() bool { return c != nil && !c.tok.Revoked }

// Store holds the fleet's tokens: it writes them to the bucket and answers
// Authenticate from an in-memory copy, a mirror of the bucket (see package
// kvmirror) that reads the bucket whole again whenever its watch ends. It
// is safe for concurrent use.
type Store struct {
	kv     jetstream.KeyValue
	log    *slog.Logger
	tokens *kvmirror.Mirror[cached] // every record of the bucket, by id

	ctx       context.Context    // lives until Close; the mirror and withdrawLoop end with it
	cancel    context.CancelFunc // ends ctx
	wg        sync.WaitGroup     // the mirror's Run and withdrawLoop
	deleteNow chan struct{}      // wakes withdrawLoop; capacity 1
	closeOnce sync.Once

	mu        sync.RWMutex // guards the fields below
	onRevoke  []func(tokenID string)
	revoked   []string            // ids seen to stop being active whose OnRevoke calls are still to be made
	withdrawn map[string]struct{} // ids of failed creates, never to be active here; see withdraw
	toDelete  []string            // withdrawn ids whose key is not deleted in NATS yet
}

// Open loads every token from kv, usually the bucket named Bucket, and keeps
// the in-memory copy current until Close: after any end of its watch it
// reads the bucket whole again. A nil logger discards. ctx bounds the
// initial load only.
func Open(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger) (*Store, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		kv:        kv,
		log:       logger.With(attrComponent, "auth"),
		deleteNow: make(chan struct{}, 1),
		withdrawn: make(map[string]struct{}),
	}
	s.tokens = kvmirror.New(kv, s.log, kvmirror.Config[cached]{
		Decode:   decodeRecord,
		OnApply:  s.appliedLocked,
		OnReload: s.reloadedLocked,
		OnChange: s.fireRevoked,
	})
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Go(func() { s.tokens.Run(s.ctx) })
	if err := s.tokens.Wait(ctx); err != nil {
		s.cancel()
		s.wg.Wait()
		return nil, fmt.Errorf("auth: open bucket %s: %w", kv.Bucket(), err)
	}
	s.wg.Go(s.withdrawLoop)
	return s, nil
}

// Resync makes the store read the whole bucket again, as it does whenever
// its watch ends; call it when the NATS connection returns, in case NATS
// came back without its files. Revocations the read reveals fire OnRevoke.
func (s *Store) Resync() { s.tokens.Resync() }

// Close stops the watch and waits for it to end. Authenticate keeps answering
// from the last known tokens.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
	})
	return nil
}

// OnRevoke registers fn to be called with a token's id when this relay learns
// that the token was revoked or deleted, whichever relay did it and however
// it learnt it (a watched change, or a full read of the bucket after its
// watch ended), so that live sessions authenticated by it can be closed. fn
// runs on a goroutine of the store, one call per revocation, and must not
// block.
func (s *Store) OnRevoke(fn func(tokenID string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRevoke = append(s.onRevoke, fn)
}

// appliedLocked notes a revocation when one change of the bucket (watched,
// or written here) ends an active token. The mirror's lock is held.
func (s *Store) appliedLocked(old, new *cached) {
	if old.active() && !new.active() {
		s.noteRevoked(old.tok.ID)
	}
}

// reloadedLocked notes a revocation for each token that was active before a
// full read and is revoked or gone in it: the changes the watch missed.
// The mirror's lock is held.
func (s *Store) reloadedLocked(old, new map[string]cached) {
	for id, c := range old {
		if n, ok := new[id]; c.active() && (!ok || !n.active()) {
			s.noteRevoked(id)
		}
	}
}

// noteRevoked queues the OnRevoke calls for id, unless id was withdrawn: it
// was never active here.
func (s *Store) noteRevoked(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, gone := s.withdrawn[id]; !gone {
		s.revoked = append(s.revoked, id)
	}
}

// fireRevoked makes the queued OnRevoke calls, outside every lock: the
// mirror calls it after each change it applied.
func (s *Store) fireRevoked() {
	s.mu.Lock()
	ids, callbacks := s.revoked, s.onRevoke // appends never touch these elements
	s.revoked = nil
	s.mu.Unlock()
	for _, id := range ids {
		for _, fn := range callbacks {
			fn(id)
		}
	}
}

// active returns the record of id if it lets its bearer in here: known,
// not revoked, not withdrawn.
func (s *Store) active(id string) (cached, bool) {
	c, ok := s.tokens.Get(id)
	if !ok || !c.active() || s.isWithdrawn(id) {
		return cached{}, false
	}
	return c, true
}

func (s *Store) isWithdrawn(id string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, gone := s.withdrawn[id]
	return gone
}

// decodeRecord decodes the record stored under key. A record it refuses
// authenticates nobody.
func decodeRecord(key string, data []byte) (cached, error) {
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return cached{}, err
	}
	var h secretHash
	b, err := hex.DecodeString(r.SecretSHA256)
	if err != nil || len(b) != len(h) {
		return cached{}, errors.New("secret_sha256 is not a hex SHA-256")
	}
	copy(h[:], b)
	if r.ID != key || !r.Kind.Valid() {
		return cached{}, fmt.Errorf("record id %q or kind %q does not fit key %q", r.ID, r.Kind, key)
	}
	return cached{hash: h, tok: Token{
		ID: r.ID, Kind: r.Kind, Name: r.Name, Devices: r.Devices,
		CreatedAt: r.CreatedAt, Revoked: r.Revoked, RevokedAt: r.RevokedAt,
	}}, nil
}

func encodeRecord(t Token, h secretHash) ([]byte, error) {
	return json.Marshal(record{
		ID: t.ID, Kind: t.Kind, Name: t.Name, Devices: t.Devices,
		CreatedAt: t.CreatedAt, SecretSHA256: hex.EncodeToString(h[:]),
		Revoked: t.Revoked, RevokedAt: t.RevokedAt,
	})
}

// Authenticate checks a token string against the in-memory copy of the
// bucket, without waiting for NATS. It returns ErrNoToken for an empty string
// and ErrInvalidToken for a malformed, unknown or revoked token.
func (s *Store) Authenticate(token string) (Principal, error) {
	if token == "" {
		return Principal{}, ErrNoToken
	}
	t, ok := parseToken(token)
	if !ok {
		return Principal{}, ErrInvalidToken
	}
	c, ok := s.active(t.id)
	h := hashSecret(t.secret)
	if !ok || subtle.ConstantTimeCompare(h[:], c.hash[:]) != 1 || c.tok.Kind != t.kind {
		return Principal{}, ErrInvalidToken
	}
	tok := c.tok
	return Principal{TokenID: tok.ID, Kind: tok.Kind, Name: tok.Name, Devices: slices.Clone(tok.Devices)}, nil
}

// Principal returns the identity of the live token with id, for a
// credential derived from it (an access code, a session) whose signature
// was checked elsewhere; ok is false once the token is revoked or gone.
func (s *Store) Principal(id string) (p Principal, ok bool) {
	c, ok := s.active(id)
	if !ok {
		return Principal{}, false
	}
	tok := c.tok
	return Principal{TokenID: tok.ID, Kind: tok.Kind, Name: tok.Name, Devices: slices.Clone(tok.Devices)}, true
}

// AuthenticateKind is Authenticate for a place that takes one kind of token
// only: a valid token of another kind yields an error wrapping ErrWrongKind,
// so the caller can say which token it needs.
func (s *Store) AuthenticateKind(token string, kind Kind) (Principal, error) {
	p, err := s.Authenticate(token)
	if err != nil {
		return Principal{}, err
	}
	if p.Kind != kind {
		return Principal{}, fmt.Errorf("%w: this is %s token, %s token is needed", ErrWrongKind, article(p.Kind), article(kind))
	}
	return p, nil
}

func article(k Kind) string {
	if k == KindAdmin {
		return "an admin"
	}
	return "a " + string(k)
}
