package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrSessionExpired means a browser session cookie was genuine but its
// lifetime has passed; the holder must sign in again.
var ErrSessionExpired = errors.New("session expired")

// A browser session is the cookie "<token id>.<expiry unix seconds>.<mac>",
// where mac is the unpadded base64url HMAC-SHA256 of sessionLabel, the id and
// the expiry, keyed by the SHA-256 of the token's secret as the bucket holds
// it. Every relay of the fleet can thus check a session from its in-memory
// copy of the bucket, without shared state, and revoking the token ends all of
// its sessions. The cookie never carries the token itself.
const (
	sessionLabel     = "switchboard browser session v1\x00"
	maxSessionCookie = 128 // far above a genuine cookie's ~63 bytes
)

var sessionMACEncoding = base64.RawURLEncoding

// NewSession returns a session cookie value for the active token tokenID that
// is valid for ttl. The token must be known to this relay and not revoked;
// otherwise the error wraps ErrNotFound.
func (s *Store) NewSession(tokenID string, ttl time.Duration) (string, error) {
	if ttl <= 0 {
		return "", fmt.Errorf("auth: new session for %s: lifetime %v is not positive", tokenID, ttl)
	}
	return s.newSession(tokenID, time.Now().Add(ttl))
}

func (s *Store) newSession(tokenID string, expires time.Time) (string, error) {
	c, ok := s.active(tokenID)
	if !ok {
		return "", fmt.Errorf("auth: new session for %q: %w", tokenID, ErrNotFound)
	}
	payload := tokenID + "." + strconv.FormatInt(expires.Unix(), 10)
	mac := sessionMAC(c.hash, payload)
	return payload + "." + sessionMACEncoding.EncodeToString(mac), nil
}

// AuthenticateSession checks a session cookie made by NewSession on any relay
// of the fleet, from the in-memory copy of the bucket. It returns ErrNoToken
// for an empty cookie, ErrInvalidToken for a malformed or altered cookie or one
// whose token is unknown or revoked, and ErrSessionExpired for a genuine
// cookie whose lifetime has passed.
func (s *Store) AuthenticateSession(cookie string) (Principal, error) {
	return s.authenticateSession(cookie, time.Now())
}

func (s *Store) authenticateSession(cookie string, now time.Time) (Principal, error) {
	if cookie == "" {
		return Principal{}, ErrNoToken
	}
	id, expires, mac, ok := parseSession(cookie)
	if !ok {
		return Principal{}, ErrInvalidToken
	}
	c, ok := s.active(id)
	if !ok {
		return Principal{}, ErrInvalidToken
	}
	payload := cookie[:strings.LastIndexByte(cookie, '.')]
	if !hmac.Equal(mac, sessionMAC(c.hash, payload)) {
		return Principal{}, ErrInvalidToken
	}
	if !now.Before(expires) {
		return Principal{}, ErrSessionExpired
	}
	tok := c.tok
	return Principal{TokenID: tok.ID, Kind: tok.Kind, Name: tok.Name, Devices: slices.Clone(tok.Devices)}, nil
}

// parseSession takes a session cookie apart, or reports that it is malformed.
// The expiry must be written as NewSession writes it, so that one expiry has
// one spelling.
func parseSession(cookie string) (id string, expires time.Time, mac []byte, ok bool) {
	if len(cookie) > maxSessionCookie {
		return "", time.Time{}, nil, false
	}
	parts := strings.Split(cookie, ".")
	if len(parts) != 3 || !validID(parts[0]) {
		return "", time.Time{}, nil, false
	}
	unix, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || strconv.FormatInt(unix, 10) != parts[1] {
		return "", time.Time{}, nil, false
	}
	mac, err = sessionMACEncoding.Strict().DecodeString(parts[2])
	if err != nil || len(mac) != sha256.Size {
		return "", time.Time{}, nil, false
	}
	return parts[0], time.Unix(unix, 0), mac, true
}

func sessionMAC(key secretHash, payload string) []byte {
	m := hmac.New(sha256.New, key[:])
	m.Write([]byte(sessionLabel))
	m.Write([]byte(payload))
	return m.Sum(nil)
}
