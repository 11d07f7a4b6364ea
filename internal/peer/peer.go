// Package peer authenticates requests that one relay forwards to another.
// The forwarding relay has already checked the user; it signs the forward
// with the fleet's peer secret, and the receiving relay, which holds the
// device, trusts a valid signature instead of asking the user again and
// never forwards such a request further (one hop).
//
// The header is "v1 <relay id> <unix seconds> <hex HMAC-SHA256>", the MAC
// over the version, relay id, time and device, so that a captured header is
// good for one device for a minute at most.
package peer

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header carries the signature of a forwarded request.
const Header = "X-Switchboard-Peer"

// HopsHeader counts, on a forwarded request, the relays it passed through.
const HopsHeader = "X-Switchboard-Hops"

// MaxSkew is how far a signature's time may be from the receiver's clock.
const MaxSkew = time.Minute

// SecretBytes is the length of a peer secret.
const SecretBytes = 32

// Errors of Verify.
var (
	ErrNoSignature  = errors.New("no peer signature")
	ErrBadSignature = errors.New("invalid peer signature")
)

// Signer signs and verifies forwards with one secret.
type Signer struct {
	secret  []byte
	relayID string
	now     func() time.Time
}

// NewSigner returns a signer for the relay relayID with secret.
func NewSigner(secret []byte, relayID string) (*Signer, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("peer secret of %d bytes is too short; use %d random bytes", len(secret), SecretBytes)
	}
	return &Signer{secret: secret, relayID: relayID, now: time.Now}, nil
}

// NewSecret returns a fresh random secret.
func NewSecret() []byte {
	b := make([]byte, SecretBytes)
	_, _ = rand.Read(b) // never fails
	return b
}

func (s *Signer) mac(relayID string, ts int64, device string) string {
	m := hmac.New(sha256.New, s.secret)
	fmt.Fprintf(m, "v1\n%s\n%d\n%s", relayID, ts, device)
	return hex.EncodeToString(m.Sum(nil))
}

// Sign sets the signature header on h for a forward of a request to device.
func (s *Signer) Sign(h http.Header, device string) {
	ts := s.now().Unix()
	h.Set(Header, fmt.Sprintf("v1 %s %d %s", s.relayID, ts, s.mac(s.relayID, ts, device)))
}

// Verify checks the signature on h for device and returns the id of the
// relay that forwarded it. ErrNoSignature means there is none.
func (s *Signer) Verify(h http.Header, device string) (string, error) {
	v := h.Get(Header)
	if v == "" {
		return "", ErrNoSignature
	}
	parts := strings.Fields(v)
	if len(parts) != 4 || parts[0] != "v1" {
		return "", fmt.Errorf("%w: malformed", ErrBadSignature)
	}
	ts, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: malformed time", ErrBadSignature)
	}
	if d := s.now().Sub(time.Unix(ts, 0)); d > MaxSkew || d < -MaxSkew {
		return "", fmt.Errorf("%w: expired or from a clock %s off", ErrBadSignature, d.Round(time.Second))
	}
	if !hmac.Equal([]byte(parts[3]), []byte(s.mac(parts[1], ts, device))) {
		return "", fmt.Errorf("%w: wrong secret or device", ErrBadSignature)
	}
	return parts[1], nil
}
