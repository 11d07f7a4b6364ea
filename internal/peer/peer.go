// Package peer authenticates requests that one relay forwards to another.
// The forwarding relay has already checked the user; it signs the forward
// with a key derived from the fleet secret (package secret, purpose
// "peer"), and the receiving relay, which holds the device, trusts a valid
// signature instead of asking the user again and never forwards such a
// request further (one hop).
//
// The header is "v2 <relay id> <unix seconds> <key fingerprint> <hex
// HMAC-SHA256>", the MAC over the version, relay id, time, fingerprint and
// device, so that a captured header is good for one device for a minute at
// most. The fingerprint names the fleet secret the signature was made with:
// a relay that does not accept it says so in its refusal. A signature
// verifies against every secret the receiver accepts, so that the fleet
// secret can be rotated without a moment where one relay signs with a key
// another refuses. Any other form of the header is refused.
package peer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/secret"
)

// Header carries the signature of a forwarded request.
const Header = "X-Switchboard-Peer"

// HopsHeader counts, on a forwarded request, the relays it passed through.
const HopsHeader = "X-Switchboard-Hops"

// MaxSkew is how far a signature's time may be from the receiver's clock.
const MaxSkew = time.Minute

// Errors of Verify.
var (
	ErrNoSignature  = errors.New("no peer signature")
	ErrBadSignature = errors.New("invalid peer signature")
	// ErrUnknownSecret is wrapped, with ErrBadSignature, when a signature
	// names a fleet secret this relay does not accept: the two relays run
	// different secrets (see docs/fleet-secret.md).
	ErrUnknownSecret = errors.New("signed with a fleet secret this relay does not accept")
)

// Signer signs and verifies forwards with the keys of a fleet secret ring.
type Signer struct {
	ring    *secret.Ring
	relayID string
	now     func() time.Time
}

// NewSigner returns a signer for the relay relayID with the secrets of
// ring, which it reads at every signature: a change of the ring applies to
// the next forward.
func NewSigner(ring *secret.Ring, relayID string) (*Signer, error) {
	if ring == nil || ring.Fingerprint() == "" {
		return nil, errors.New("peer: a signer needs a fleet secret ring with a secret")
	}
	if relayID == "" || strings.ContainsAny(relayID, " \t\r\n") {
		return nil, fmt.Errorf("peer: relay id %q is empty or has spaces", relayID)
	}
	return &Signer{ring: ring, relayID: relayID, now: time.Now}, nil
}

// macV2 is the MAC of a v2 header made with key.
func macV2(key []byte, relayID string, ts int64, fp, device string) []byte {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "v2\n%s\n%d\n%s\n%s", relayID, ts, fp, device)
	return m.Sum(nil)
}

// Sign sets the signature header on h for a forward of a request to device.
func (s *Signer) Sign(h http.Header, device string) { h.Set(Header, s.Signature(device)) }

// Signature returns a signature for a forward to device, the value Sign
// puts in the header: a stream forwarded to the device's holder carries it
// in its opening (package forward).
func (s *Signer) Signature(device string) string {
	ts := s.now().Unix()
	fp := s.ring.Fingerprint()
	mac := macV2(s.ring.SigningKey(secret.PurposePeer), s.relayID, ts, fp, device)
	return fmt.Sprintf("v2 %s %d %s %s", s.relayID, ts, fp, hex.EncodeToString(mac))
}

// Verify checks the signature on h for device and returns the id of the
// relay that forwarded it. ErrNoSignature means there is none; any other
// failure wraps ErrBadSignature.
func (s *Signer) Verify(h http.Header, device string) (string, error) {
	return s.VerifySignature(h.Get(Header), device)
}

// VerifySignature checks a signature v, as Signature made it, for device,
// and returns the id of the relay that made it, as Verify does.
func (s *Signer) VerifySignature(v, device string) (string, error) {
	if v == "" {
		return "", ErrNoSignature
	}
	parts := strings.Fields(v)
	if len(parts) != 5 || parts[0] != "v2" {
		return "", fmt.Errorf("%w: malformed", ErrBadSignature)
	}
	relayID, fp, mac := parts[1], parts[3], parts[4]
	ts, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: malformed time", ErrBadSignature)
	}
	got, err := hex.DecodeString(mac)
	if err != nil || len(got) != sha256.Size || mac != strings.ToLower(mac) {
		return "", fmt.Errorf("%w: malformed MAC", ErrBadSignature)
	}
	if d := s.now().Sub(time.Unix(ts, 0)); d > MaxSkew || d < -MaxSkew {
		return "", fmt.Errorf("%w: expired or from a clock %s off", ErrBadSignature, d.Round(time.Second))
	}
	ok := false
	for _, key := range s.ring.VerifyKeys(secret.PurposePeer) {
		ok = hmac.Equal(got, macV2(key, relayID, ts, fp, device)) || ok
	}
	switch {
	case ok:
		return relayID, nil
	case !s.ring.Accepts(fp):
		return "", fmt.Errorf("%w: %w: relay %s signed with fleet secret %s; this relay accepts %s",
			ErrBadSignature, ErrUnknownSecret, relayID, fp, strings.Join(s.ring.Accepted(), ", "))
	default:
		return "", fmt.Errorf("%w: wrong secret or device", ErrBadSignature)
	}
}
