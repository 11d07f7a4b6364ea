package peer

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/secret"
)

func ring(t testing.TB, signing []byte, others ...[]byte) *secret.Ring {
	t.Helper()
	r, err := secret.NewRing(signing, others...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func signer(t testing.TB, r *secret.Ring, id string) *Signer {
	t.Helper()
	s, err := NewSigner(r, id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSignVerify(t *testing.T) {
	sec := secret.New()
	a := signer(t, ring(t, sec), "rl-aaaaaaaa")
	b := signer(t, ring(t, sec), "rl-bbbbbbbb")
	other := signer(t, ring(t, secret.New()), "rl-cccccccc")
	h := http.Header{}
	a.Sign(h, "robot-1")
	if v := h.Get(Header); !strings.HasPrefix(v, "v2 rl-aaaaaaaa ") || !strings.Contains(v, " "+secret.Fingerprint(sec)+" ") {
		t.Fatalf("header %q: want v2, the relay id and the secret's fingerprint", v)
	}
	if from, err := b.Verify(h, "robot-1"); err != nil || from != "rl-aaaaaaaa" {
		t.Fatalf("Verify = %q, %v", from, err)
	}
	if _, err := b.Verify(h, "robot-2"); !errors.Is(err, ErrBadSignature) || errors.Is(err, ErrUnknownSecret) {
		t.Errorf("another device: %v", err)
	}
	_, err := other.Verify(h, "robot-1")
	if !errors.Is(err, ErrBadSignature) || !errors.Is(err, ErrUnknownSecret) || !strings.Contains(err.Error(), secret.Fingerprint(sec)) {
		t.Errorf("another secret: %v; want ErrUnknownSecret naming the fingerprint", err)
	}
	if _, err := b.Verify(http.Header{}, "robot-1"); !errors.Is(err, ErrNoSignature) {
		t.Errorf("no header: %v", err)
	}
	b.now = func() time.Time { return time.Now().Add(2 * MaxSkew) }
	if _, err := b.Verify(h, "robot-1"); !errors.Is(err, ErrBadSignature) {
		t.Errorf("stale signature: %v", err)
	}
	mac := strings.Repeat("00", sha256.Size)
	for _, bad := range []string{"v1", "v3 rl-aaaaaaaa 1 00", "v1 rl-aaaaaaaa x " + mac, "v1 rl-aaaaaaaa 1 zz extra",
		"v2 rl-aaaaaaaa 1 " + mac, "v1 rl-aaaaaaaa 1 " + strings.ToUpper(strings.Repeat("ab", sha256.Size)), "v1 rl-aaaaaaaa 1 abcd"} {
		if _, err := a.Verify(http.Header{Header: {bad}}, "robot-1"); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := NewSigner(nil, "rl-aaaaaaaa"); err == nil {
		t.Error("a signer without a ring was made")
	}
	if _, err := NewSigner(&secret.Ring{}, "rl-aaaaaaaa"); err == nil {
		t.Error("a signer with an empty ring was made")
	}
	if _, err := NewSigner(ring(t, sec), "rl a"); err == nil {
		t.Error("a relay id with a space was taken")
	}
}

// TestSignature: the bare signature, as a stream forward's opening carries
// it, verifies as the header does, for its device only.
func TestSignature(t *testing.T) {
	sec := secret.New()
	a := signer(t, ring(t, sec), "rl-aaaaaaaa")
	b := signer(t, ring(t, sec), "rl-bbbbbbbb")
	v := a.Signature("robot-1")
	if from, err := b.VerifySignature(v, "robot-1"); err != nil || from != "rl-aaaaaaaa" {
		t.Fatalf("VerifySignature = %q, %v", from, err)
	}
	if from, err := b.Verify(http.Header{Header: {v}}, "robot-1"); err != nil || from != "rl-aaaaaaaa" {
		t.Errorf("the same value as a header: %q, %v", from, err)
	}
	if _, err := b.VerifySignature(v, "/forward"); !errors.Is(err, ErrBadSignature) {
		t.Errorf("another scope: %v", err)
	}
	if _, err := b.VerifySignature("", "robot-1"); !errors.Is(err, ErrNoSignature) {
		t.Errorf("none: %v", err)
	}
}

// TestRotation walks the fleet secret through a rotation with two relays
// changing their rings one after the other, as their watches deliver the
// record: at every step each verifies what the other signs.
func TestRotation(t *testing.T) {
	old, next := secret.New(), secret.New()
	ra, rb := ring(t, old), ring(t, old)
	a, b := signer(t, ra, "rl-aaaaaaaa"), signer(t, rb, "rl-bbbbbbbb")
	steps := []struct {
		name string
		ring *secret.Ring
		set  [][]byte // signing first
	}{
		{"a accepts the new secret", ra, [][]byte{old, next}},
		{"b accepts the new secret", rb, [][]byte{old, next}},
		{"a signs with it", ra, [][]byte{next, old}},
		{"b signs with it", rb, [][]byte{next, old}},
		{"a drops the old one", ra, [][]byte{next}},
		{"b drops the old one", rb, [][]byte{next}},
	}
	check := func(step string) {
		for _, p := range [][2]*Signer{{a, b}, {b, a}} {
			h := http.Header{}
			p[0].Sign(h, "robot-1")
			if _, err := p[1].Verify(h, "robot-1"); err != nil {
				t.Fatalf("%s: %s refuses %s: %v", step, p[1].relayID, p[0].relayID, err)
			}
		}
	}
	check("before")
	for _, s := range steps {
		if err := s.ring.Set(s.set[0], s.set[1:]...); err != nil {
			t.Fatal(err)
		}
		check(s.name)
	}
	// Switching the signing secret on one relay before the other accepts
	// it — what the two phases exist to prevent — breaks forwards.
	c, d := ring(t, next), ring(t, next)
	if err := c.Set(secret.New()); err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	signer(t, c, "rl-cccccccc").Sign(h, "robot-1")
	if _, err := signer(t, d, "rl-dddddddd").Verify(h, "robot-1"); !errors.Is(err, ErrUnknownSecret) {
		t.Fatalf("a one-sided switch: %v, want ErrUnknownSecret", err)
	}
}

// v1Header is the header of a format that never shipped: v1, the raw
// secret as the key and no fingerprint.
func v1Header(sec []byte, relayID string, ts int64, device string) string {
	m := hmac.New(sha256.New, sec)
	fmt.Fprintf(m, "v1\n%s\n%d\n%s", relayID, ts, device)
	return fmt.Sprintf("v1 %s %d %s", relayID, ts, hex.EncodeToString(m.Sum(nil)))
}

// TestOnlyV2 refuses a v1 header, even one made with an accepted secret:
// the one form of the signature is v2.
func TestOnlyV2(t *testing.T) {
	sec := secret.New()
	s := signer(t, ring(t, sec), "rl-aaaaaaaa")
	h := http.Header{Header: {v1Header(sec, "rl-bbbbbbbb", time.Now().Unix(), "robot-1")}}
	if from, err := s.Verify(h, "robot-1"); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("a v1 header: %q, %v; want ErrBadSignature", from, err)
	}
}

// fuzzNow is the fuzzer's clock, fixed so that the seeded signatures stay
// valid whenever the fuzzer runs.
var fuzzNow = time.Unix(1_800_000_000, 0)

func FuzzVerify(f *testing.F) {
	sec, old := secret.New(), secret.New()
	s := signer(f, ring(f, sec, old), "rl-aaaaaaaa")
	s.now = func() time.Time { return fuzzNow }
	h := http.Header{}
	s.Sign(h, "robot-1")
	f.Add(h.Get(Header), "robot-1")
	f.Add(v1Header(old, "rl-bbbbbbbb", fuzzNow.Unix(), "robot-2"), "robot-2")
	f.Add(v1Header(sec, "rl-bbbbbbbb", fuzzNow.Unix()+30, ""), "")
	f.Add("v1 a 1 b", "")
	f.Add("v2 a 1 "+secret.Fingerprint(sec)+" b", "x")
	f.Fuzz(func(t *testing.T, v, device string) {
		from, err := s.Verify(http.Header{Header: {v}}, device)
		if err != nil {
			if v == "" && !errors.Is(err, ErrNoSignature) || v != "" && !errors.Is(err, ErrBadSignature) {
				t.Fatalf("%q: %v, want ErrNoSignature for an empty header, else ErrBadSignature", v, err)
			}
			return
		}
		if from == "" {
			t.Fatal("accepted a signature without a relay id")
		}
		// What is accepted is exactly what a holder of an accepted
		// secret signs for this device, at a time within the skew.
		parts := strings.Fields(v)
		ts, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil || time.Unix(ts, 0).Sub(fuzzNow).Abs() > MaxSkew {
			t.Fatalf("accepted the time %q", parts[2])
		}
		var want []string
		for _, k := range [][]byte{sec, old} {
			r := ring(t, k)
			m := macV2(r.SigningKey(secret.PurposePeer), from, ts, secret.Fingerprint(k), device)
			want = append(want, fmt.Sprintf("v2 %s %d %s %s", from, ts, secret.Fingerprint(k), hex.EncodeToString(m)))
		}
		canonical := strings.Join(parts, " ")
		if !slices.Contains(want, canonical) {
			t.Fatalf("accepted %q for device %q, which no accepted secret signs", v, device)
		}
		if _, err := s.Verify(http.Header{Header: {v}}, device+"x"); err == nil {
			t.Fatalf("%q is accepted for %q and for %q", v, device, device+"x")
		}
	})
}
