// Package secret holds the fleet secret a relay runs: the key it signs
// with and the keys it accepts, so that the secret can be rotated without
// a moment where one relay signs with a key another does not yet accept.
// Every use (peer forwards, access codes) derives its own key from the
// secret, so that a value signed for one purpose is worthless for another.
package secret

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync/atomic"
)

// Bytes is the length of a fleet secret minted by New.
const Bytes = 32

// MinBytes is the shortest secret a Ring accepts.
const MinBytes = 16

// Purposes of derived keys.
const (
	PurposePeer = "peer"        // signatures of forwards between relays
	PurposeCode = "access-code" // single-use access codes for users
)

// purposes are the purposes whose keys a Ring derives once per Set.
var purposes = []string{PurposePeer, PurposeCode}

// New returns a fresh random secret.
func New() []byte {
	b := make([]byte, Bytes)
	_, _ = rand.Read(b) // never fails
	return b
}

// Fingerprint names a secret without revealing it: the first 8 bytes, in
// hex, of an HMAC-SHA256 keyed by the secret over a fixed label. Two relays
// with the same fingerprint run the same secret.
func Fingerprint(s []byte) string {
	m := hmac.New(sha256.New, s)
	m.Write([]byte("switchboard fleet secret fingerprint"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// derive returns the key for purpose under secret s.
func derive(s []byte, purpose string) []byte {
	m := hmac.New(sha256.New, s)
	m.Write([]byte("switchboard/" + purpose))
	return m.Sum(nil)
}

// keys is one immutable state of a Ring.
type keys struct {
	signing  []byte
	accepted [][]byte // signing first
	derived  map[string][][]byte
	fp       string
	fps      []string
}

// Ring is the secret a relay runs: one signing secret and the secrets it
// accepts (the signing one among them). It is safe for concurrent use; Set
// swaps the whole state at once. The zero Ring has no secret: it signs with
// no key and accepts none; use NewRing or Set.
type Ring struct {
	cur atomic.Pointer[keys]
}

// NewRing returns a ring that signs with signing and also accepts others.
func NewRing(signing []byte, others ...[]byte) (*Ring, error) {
	r := &Ring{}
	if err := r.Set(signing, others...); err != nil {
		return nil, err
	}
	return r, nil
}

// Set makes signing the secret to sign with and others, besides it, the
// secrets to accept. It keeps copies: the caller may reuse its buffers. On
// error the ring keeps what it had.
func (r *Ring) Set(signing []byte, others ...[]byte) error {
	k := &keys{derived: map[string][][]byte{}}
	for _, s := range append([][]byte{signing}, others...) {
		if len(s) < MinBytes {
			return fmt.Errorf("a fleet secret of %d bytes is too short; use %d random bytes", len(s), Bytes)
		}
		fp := Fingerprint(s)
		dup := false
		for _, have := range k.fps {
			dup = dup || have == fp
		}
		if dup {
			continue
		}
		k.accepted = append(k.accepted, slices.Clone(s))
		k.fps = append(k.fps, fp)
	}
	k.signing, k.fp = k.accepted[0], k.fps[0]
	for _, p := range purposes {
		for _, s := range k.accepted {
			k.derived[p] = append(k.derived[p], derive(s, p))
		}
	}
	r.cur.Store(k)
	return nil
}

// load returns the current state; a zero Ring's is empty.
func (r *Ring) load() *keys {
	if k := r.cur.Load(); k != nil {
		return k
	}
	return &keys{}
}

// SigningKey returns the key to sign with for purpose, nil when the ring
// has no secret. The caller may keep and modify it.
func (r *Ring) SigningKey(purpose string) []byte {
	k := r.load()
	if k.signing == nil {
		return nil
	}
	if d, ok := k.derived[purpose]; ok {
		return slices.Clone(d[0])
	}
	return derive(k.signing, purpose)
}

// VerifyKeys returns the keys a signature for purpose may have been made
// with, the signing one first; none when the ring has no secret. The caller
// may keep and modify them: they are copies, so that one caller's append or
// overwrite never reaches another.
func (r *Ring) VerifyKeys(purpose string) [][]byte {
	k := r.load()
	out := make([][]byte, len(k.accepted))
	d, ok := k.derived[purpose]
	for i, s := range k.accepted {
		if ok {
			out[i] = slices.Clone(d[i])
		} else {
			out[i] = derive(s, purpose)
		}
	}
	return out
}

// Fingerprint returns the fingerprint of the signing secret, "" when the
// ring has none.
func (r *Ring) Fingerprint() string { return r.load().fp }

// Accepted returns the fingerprints of every accepted secret, the signing
// one first.
func (r *Ring) Accepted() []string {
	return slices.Clone(r.load().fps)
}

// Accepts reports whether the secret with fingerprint fp is accepted.
func (r *Ring) Accepts(fp string) bool { return slices.Contains(r.load().fps, fp) }
