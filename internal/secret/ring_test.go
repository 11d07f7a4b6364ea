package secret

import (
	"bytes"
	"encoding/hex"
	"slices"
	"sync"
	"testing"
)

func mustRing(t *testing.T, signing []byte, others ...[]byte) *Ring {
	t.Helper()
	r, err := NewRing(signing, others...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestFingerprint(t *testing.T) {
	a, b := New(), New()
	if len(a) != Bytes || bytes.Equal(a, b) {
		t.Fatalf("New returned %d bytes, twice the same: %v", len(a), bytes.Equal(a, b))
	}
	fa := Fingerprint(a)
	if len(fa) != 16 || fa != Fingerprint(bytes.Clone(a)) || fa == Fingerprint(b) {
		t.Fatalf("Fingerprint = %q (of b %q): want 16 hex digits, stable, distinct", fa, Fingerprint(b))
	}
	if fa == hex.EncodeToString(a[:8]) {
		t.Fatal("the fingerprint shows the secret")
	}
}

func TestRingKeys(t *testing.T) {
	old, cur := New(), New()
	r := mustRing(t, cur, old)
	if r.Fingerprint() != Fingerprint(cur) {
		t.Errorf("Fingerprint = %s, want the signing secret's %s", r.Fingerprint(), Fingerprint(cur))
	}
	if got, want := r.Accepted(), []string{Fingerprint(cur), Fingerprint(old)}; !slices.Equal(got, want) {
		t.Errorf("Accepted = %v, want %v (signing first)", got, want)
	}
	if !r.Accepts(Fingerprint(old)) || r.Accepts(Fingerprint(New())) {
		t.Error("Accepts is wrong")
	}
	peer, code := r.SigningKey(PurposePeer), r.SigningKey(PurposeCode)
	if bytes.Equal(peer, code) || bytes.Equal(peer, cur) || bytes.Equal(code, cur) {
		t.Error("the keys of two purposes, or a key and the secret, are equal")
	}
	if vk := r.VerifyKeys(PurposePeer); len(vk) != 2 || !bytes.Equal(vk[0], peer) || bytes.Equal(vk[1], peer) {
		t.Errorf("VerifyKeys(peer) = %d keys, want the signing key first and the old one's second", len(vk))
	}
	// The same secrets give the same keys on another relay.
	other := mustRing(t, cur)
	if !bytes.Equal(other.SigningKey(PurposePeer), peer) || !bytes.Equal(other.VerifyKeys(PurposeCode)[0], code) {
		t.Error("two rings with the same secret derive different keys")
	}
	// No purpose hands out the secrets themselves, not even the one
	// earlier builds used for raw-secret signatures.
	if raw := r.SigningKey("legacy-peer"); bytes.Equal(raw, cur) || bytes.Equal(r.VerifyKeys("legacy-peer")[1], old) {
		t.Error("a purpose's keys are the raw secrets")
	}
	// A purpose the ring does not precompute is derived on demand.
	if k := r.SigningKey("other"); len(k) != 32 || bytes.Equal(k, peer) || !bytes.Equal(r.VerifyKeys("other")[0], k) {
		t.Error("an ad hoc purpose gives no stable key of its own")
	}
}

func TestRingSet(t *testing.T) {
	a, b := New(), New()
	r := mustRing(t, a)
	if err := r.Set(b, a, b, a); err != nil {
		t.Fatal(err)
	}
	if got := r.Accepted(); !slices.Equal(got, []string{Fingerprint(b), Fingerprint(a)}) {
		t.Errorf("after Set(b, a, b, a): Accepted = %v, want b then a, once each", got)
	}
	for _, bad := range [][][]byte{{[]byte("short")}, {New(), []byte("x")}, {nil}} {
		if err := r.Set(bad[0], bad[1:]...); err == nil {
			t.Errorf("Set accepted a secret of %d bytes", len(bad[len(bad)-1]))
		}
	}
	if r.Fingerprint() != Fingerprint(b) || len(r.Accepted()) != 2 {
		t.Error("a failed Set changed the ring")
	}
	if _, err := NewRing(make([]byte, MinBytes-1)); err == nil {
		t.Error("NewRing took a short secret")
	}
}

// TestRingCopies checks that the ring shares no memory with its callers:
// a buffer reused after Set, or a key list appended to or overwritten, must
// not change what the ring signs and verifies with.
func TestRingCopies(t *testing.T) {
	s := New()
	want := Fingerprint(s)
	buf := bytes.Clone(s)
	r := mustRing(t, buf, New(), New())
	clear(buf)
	if r.Fingerprint() != want || !bytes.Equal(r.SigningKey(PurposePeer), derive(s, PurposePeer)) {
		t.Fatal("the ring follows a buffer its caller reused")
	}
	peer := r.SigningKey(PurposePeer)
	vk := r.VerifyKeys(PurposePeer)
	_ = append(vk[:1], []byte("an attacker's key"))
	vk[0][0] ^= 0xff
	r.SigningKey(PurposePeer)[0] ^= 0xff
	again := r.VerifyKeys(PurposePeer)
	if !bytes.Equal(again[0], peer) || bytes.Equal(again[1], []byte("an attacker's key")) || !bytes.Equal(r.SigningKey(PurposePeer), peer) {
		t.Fatal("a caller's changes to returned keys reached the ring")
	}
}

func TestZeroRing(t *testing.T) {
	var r Ring
	if r.Fingerprint() != "" || len(r.Accepted()) != 0 || r.SigningKey(PurposePeer) != nil || len(r.VerifyKeys(PurposePeer)) != 0 || r.Accepts("") {
		t.Fatal("the zero ring signs or accepts something")
	}
}

// TestRingConcurrent swaps the secret while others sign and verify; run
// with -race. Every reader sees one whole state.
func TestRingConcurrent(t *testing.T) {
	secrets := [][]byte{New(), New(), New()}
	r := mustRing(t, secrets[0], secrets[1])
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if len(r.Accepted()) != 2 || len(r.VerifyKeys(PurposePeer)) != 2 || len(r.SigningKey(PurposeCode)) != 32 {
					t.Error("a reader saw a torn ring")
					return
				}
			}
		})
	}
	for i := range 2000 {
		if err := r.Set(secrets[i%3], secrets[(i+1)%3]); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
