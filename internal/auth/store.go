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

// cached is a decoded record as the in-memory cache keeps it.
type cached struct {
	tok  Token
	hash secretHash
}

// entry is the cache's view of one key: the latest revision seen, and the
// token at that revision, nil once the key was deleted.
type entry struct {
	rev uint64
	tok *cached
}

func (e entry) active() bool { return e.tok != nil && !e.tok.tok.Revoked }

// Store holds the fleet's tokens: it writes them to the bucket and answers
// Authenticate from an in-memory copy kept current by a watch on the bucket.
// It is safe for concurrent use.
type Store struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	watchCtx     context.Context    // lives until Close; the watch ends with it
	cancelWatch  context.CancelFunc // ends watchCtx
	watcher      jetstream.KeyWatcher
	watchDone    chan struct{} // closed when the watch goroutine returns
	deleteNow    chan struct{} // wakes withdrawLoop; capacity 1
	withdrawDone chan struct{} // closed when withdrawLoop returns
	closeOnce    sync.Once

	mu        sync.RWMutex // guards the fields below
	entries   map[string]entry
	onRevoke  []func(tokenID string)
	withdrawn map[string]struct{} // ids of failed creates, never to be active here; see withdraw
	toDelete  []string            // withdrawn ids whose key is not deleted in NATS yet
}

// Open loads every token from kv, usually the bucket named Bucket, and starts
// a watch that keeps the in-memory copy current until Close. A nil logger
// discards. ctx bounds the initial load only.
func Open(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger) (*Store, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		kv:           kv,
		log:          logger.With(attrComponent, "auth"),
		watchDone:    make(chan struct{}),
		deleteNow:    make(chan struct{}, 1),
		withdrawDone: make(chan struct{}),
		entries:      make(map[string]entry),
		withdrawn:    make(map[string]struct{}),
	}
	// The watch must outlive ctx, but Open must not outlive it.
	s.watchCtx, s.cancelWatch = context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, s.cancelWatch)
	err := s.startWatch(ctx)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		s.cancelWatch()
		if s.watcher != nil {
			_ = s.watcher.Stop()
			for range s.watcher.Updates() { // unblock the delivery until the watch closes
			}
		}
		return nil, fmt.Errorf("auth: open bucket %s: %w", kv.Bucket(), err)
	}
	go s.watch()
	go s.withdrawLoop()
	return s, nil
}

// startWatch starts the watch and applies the bucket's current contents.
func (s *Store) startWatch(ctx context.Context) error {
	w, err := s.kv.WatchAll(s.watchCtx)
	if err != nil {
		return err
	}
	s.watcher = w
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch ended during the initial load")
			}
			if e == nil { // the bucket's current contents are all in
				return nil
			}
			s.applyEntry(e)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watch applies updates until the watch ends, on Close or when the NATS
// connection is closed for good.
func (s *Store) watch() {
	defer close(s.watchDone)
	for e := range s.watcher.Updates() {
		if e != nil {
			s.applyEntry(e)
		}
	}
	if s.watchCtx.Err() == nil {
		s.log.Warn("token watch ended: the NATS connection is closed; token changes made elsewhere are no longer seen")
	}
}

// Close stops the watch and waits for it to end. Authenticate keeps answering
// from the last known tokens.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.cancelWatch()
		_ = s.watcher.Stop() // fails only when the connection is already closed
		<-s.watchDone
		<-s.withdrawDone
	})
	return nil
}

// OnRevoke registers fn to be called with a token's id when this relay learns
// that the token was revoked or deleted, whichever relay did it, so that live
// sessions authenticated by it can be closed. fn runs on the goroutine that
// saw the change and must not block.
func (s *Store) OnRevoke(fn func(tokenID string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRevoke = append(s.onRevoke, fn)
}

// applyEntry applies one update from the bucket to the cache.
func (s *Store) applyEntry(e jetstream.KeyValueEntry) {
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		s.apply(e.Key(), nil, e.Revision())
		return
	}
	c, err := decodeRecord(e.Key(), e.Value())
	if err != nil {
		s.log.Warn("ignoring a malformed token record", attrTokenID, e.Key(), attrError, err)
	}
	s.apply(e.Key(), c, e.Revision()) // a malformed record authenticates nobody
}

// apply records the token c (nil: gone) at revision rev unless the cache has
// seen a later revision, and calls the OnRevoke functions if a live token
// stopped being so.
func (s *Store) apply(id string, c *cached, rev uint64) {
	s.mu.Lock()
	old, seen := s.entries[id]
	if seen && old.rev >= rev {
		s.mu.Unlock()
		return
	}
	if _, gone := s.withdrawn[id]; gone {
		c = nil // a failed create that reached NATS after all: never active
	}
	next := entry{rev: rev, tok: c}
	s.entries[id] = next
	callbacks := s.onRevoke // appends never touch these elements
	s.mu.Unlock()

	if old.active() && !next.active() {
		for _, fn := range callbacks {
			fn(id)
		}
	}
}

func decodeRecord(key string, data []byte) (*cached, error) {
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	var h secretHash
	b, err := hex.DecodeString(r.SecretSHA256)
	if err != nil || len(b) != len(h) {
		return nil, errors.New("secret_sha256 is not a hex SHA-256")
	}
	copy(h[:], b)
	if r.ID != key || !r.Kind.Valid() {
		return nil, fmt.Errorf("record id %q or kind %q does not fit key %q", r.ID, r.Kind, key)
	}
	return &cached{hash: h, tok: Token{
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
	s.mu.RLock()
	e := s.entries[t.id]
	s.mu.RUnlock()
	h := hashSecret(t.secret)
	if e.tok == nil || subtle.ConstantTimeCompare(h[:], e.tok.hash[:]) != 1 {
		return Principal{}, ErrInvalidToken
	}
	if e.tok.tok.Kind != t.kind || e.tok.tok.Revoked {
		return Principal{}, ErrInvalidToken
	}
	tok := e.tok.tok
	return Principal{TokenID: tok.ID, Kind: tok.Kind, Name: tok.Name, Devices: slices.Clone(tok.Devices)}, nil
}

// Principal returns the identity of the live token with id, for a
// credential derived from it (an access code, a session) whose signature
// was checked elsewhere; ok is false once the token is revoked or gone.
func (s *Store) Principal(id string) (p Principal, ok bool) {
	s.mu.RLock()
	e := s.entries[id]
	s.mu.RUnlock()
	if !e.active() {
		return Principal{}, false
	}
	tok := e.tok.tok
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
