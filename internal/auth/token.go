// Package auth owns the fleet's credentials: agent, user and admin bearer
// tokens. Tokens live hashed in a JetStream key-value bucket shared by every
// relay; each relay keeps them in memory, a mirror of the bucket fed by a
// watch and read whole again whenever the watch ends (package kvmirror), so
// that checking a token never waits for NATS and a revocation made on any
// relay takes effect on all of them within a second. Secrets are shown once,
// when a token is created, and are never stored or logged.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"path"
	"slices"
	"strings"
	"time"
)

// Bucket is the JetStream key-value bucket that holds the token records.
const Bucket = "switchboard_tokens"

// Kind says what a token lets its bearer do.
type Kind string

// The kinds of token.
const (
	KindAgent Kind = "agent" // may serve the listed device names
	KindUser  Kind = "user"  // may use the listed device names; none listed means every device
	KindAdmin Kind = "admin" // may use the operator API
)

// Valid reports whether k is one of the known kinds.
func (k Kind) Valid() bool {
	return k == KindAgent || k == KindUser || k == KindAdmin
}

// letter is the kind's letter in the token string.
func (k Kind) letter() byte {
	switch k {
	case KindAgent:
		return 'a'
	case KindUser:
		return 'u'
	default:
		return 'x'
	}
}

func kindOfLetter(c byte) (Kind, bool) {
	switch c {
	case 'a':
		return KindAgent, true
	case 'u':
		return KindUser, true
	case 'x':
		return KindAdmin, true
	default:
		return "", false
	}
}

// Errors returned by Authenticate and the token operations.
var (
	// ErrNoToken means no credential was presented at all.
	ErrNoToken = errors.New("no token presented")
	// ErrInvalidToken means the token is malformed, unknown or revoked; which
	// one is deliberately not said.
	ErrInvalidToken = errors.New("invalid token")
	// ErrWrongKind means a valid token of another kind than required.
	ErrWrongKind = errors.New("wrong kind of token")
	// ErrNotFound means no token has the given id.
	ErrNotFound = errors.New("token not found")
)

// Token is what the fleet knows about a token: everything except its secret
// and the secret's hash.
type Token struct {
	ID        string    // 8 lowercase hex digits, the key in the bucket
	Kind      Kind      // what the token is for
	Name      string    // who or what holds it, for people
	Devices   []string  // device names or globs, or DEVICE/SERVICE for one service; see Principal.Allows
	CreatedAt time.Time // when it was created
	Revoked   bool      // whether it was revoked
	RevokedAt time.Time // when it was revoked; zero if it was not
}

// Principal is the identity a valid token proves.
type Principal struct {
	TokenID string
	Kind    Kind
	Name    string
	Devices []string // device names or globs, as in Token
}

// Allows reports whether the principal may serve (agent) or use (user) the
// named device whole: its HTTP backend, its topics and every service.
// Admins may use every device; a user token that lists no devices may use
// every device; an agent token serves only what it lists. An entry that
// names a service (DEVICE/SERVICE) does not allow the device whole.
func (p Principal) Allows(device string) bool {
	switch p.Kind {
	case KindAdmin:
		return true
	case KindUser:
		return len(p.Devices) == 0 || matchAny(p.Devices, device)
	case KindAgent:
		return matchAny(p.Devices, device)
	default:
		return false
	}
}

// AllowsService reports whether the user principal may reach the device's
// service of that name (switchboard connect): a token that allows the
// device whole, or lists DEVICE/SERVICE (the device a name or glob).
func (p Principal) AllowsService(device, service string) bool {
	if p.Kind == KindAgent {
		return false
	}
	if p.Allows(device) {
		return true
	}
	for _, e := range p.Devices {
		if pat, svc, ok := strings.Cut(e, "/"); ok && svc == service && matchOne(pat, device) {
			return true
		}
	}
	return false
}

// AllowsAny reports whether the principal may use the device whole or any
// of its services: a user sees such a device in their list.
func (p Principal) AllowsAny(device string) bool {
	if p.Allows(device) {
		return true
	}
	if p.Kind != KindUser {
		return false
	}
	for _, e := range p.Devices {
		if pat, _, ok := strings.Cut(e, "/"); ok && matchOne(pat, device) {
			return true
		}
	}
	return false
}

// matchAny reports whether a whole-device entry of patterns matches
// device; entries that name a service (DEVICE/SERVICE) match none.
func matchAny(patterns []string, device string) bool {
	for _, p := range patterns {
		if !strings.Contains(p, "/") && matchOne(p, device) {
			return true
		}
	}
	return false
}

func matchOne(pattern, device string) bool {
	if device == "" {
		return false
	}
	ok, _ := path.Match(pattern, device)
	return ok
}

// The token string: "sb" + kind letter + "_" + id + "_" + secret.
const (
	idBytes     = 4  // id: 8 lowercase hex digits
	secretBytes = 32 // secret: 43 characters of unpadded base64url
	idLen       = 2 * idBytes
	secretLen   = (secretBytes*8 + 5) / 6
	prefixLen   = len("sbx_")
	tokenLen    = prefixLen + idLen + 1 + secretLen
)

// secretHash is the SHA-256 of a token's secret part.
type secretHash [sha256.Size]byte

func hashSecret(secret string) secretHash { return sha256.Sum256([]byte(secret)) }

// parsedToken is a syntactically valid token string, taken apart.
type parsedToken struct {
	kind   Kind
	id     string
	secret string
}

// parseToken takes a token string apart, or reports that it is malformed.
func parseToken(s string) (parsedToken, bool) {
	if len(s) != tokenLen || s[0] != 's' || s[1] != 'b' || s[3] != '_' || s[prefixLen+idLen] != '_' {
		return parsedToken{}, false
	}
	kind, ok := kindOfLetter(s[2])
	if !ok {
		return parsedToken{}, false
	}
	t := parsedToken{kind: kind, id: s[prefixLen : prefixLen+idLen], secret: s[prefixLen+idLen+1:]}
	if !validID(t.id) || !isBase64URL(t.secret) {
		return parsedToken{}, false
	}
	return t, true
}

func (t parsedToken) String() string {
	return "sb" + string(t.kind.letter()) + "_" + t.id + "_" + t.secret
}

// validID reports whether id looks like a token id: 8 lowercase hex digits.
func validID(id string) bool {
	if len(id) != idLen {
		return false
	}
	for i := range len(id) {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func isBase64URL(s string) bool {
	for i := range len(s) {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// newToken returns a fresh token string of the given kind.
func newToken(kind Kind) (parsedToken, error) {
	var id [idBytes]byte
	var secret [secretBytes]byte
	if _, err := rand.Read(id[:]); err != nil {
		return parsedToken{}, err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return parsedToken{}, err
	}
	return parsedToken{
		kind:   kind,
		id:     hex.EncodeToString(id[:]),
		secret: base64.RawURLEncoding.EncodeToString(secret[:]),
	}, nil
}

func cloneToken(t Token) Token {
	t.Devices = slices.Clone(t.Devices)
	return t
}
