package peer

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	secret := NewSecret()
	a, _ := NewSigner(secret, "rl-aaaaaaaa")
	b, _ := NewSigner(secret, "rl-bbbbbbbb")
	other, _ := NewSigner(NewSecret(), "rl-cccccccc")
	h := http.Header{}
	a.Sign(h, "robot-1")
	if from, err := b.Verify(h, "robot-1"); err != nil || from != "rl-aaaaaaaa" {
		t.Fatalf("Verify = %q, %v", from, err)
	}
	if _, err := b.Verify(h, "robot-2"); !errors.Is(err, ErrBadSignature) {
		t.Errorf("another device: %v", err)
	}
	if _, err := other.Verify(h, "robot-1"); !errors.Is(err, ErrBadSignature) {
		t.Errorf("another secret: %v", err)
	}
	if _, err := b.Verify(http.Header{}, "robot-1"); !errors.Is(err, ErrNoSignature) {
		t.Errorf("no header: %v", err)
	}
	b.now = func() time.Time { return time.Now().Add(2 * MaxSkew) }
	if _, err := b.Verify(h, "robot-1"); !errors.Is(err, ErrBadSignature) {
		t.Errorf("stale signature: %v", err)
	}
	for _, bad := range []string{"v1", "v2 rl-aaaaaaaa 1 00", "v1 rl-aaaaaaaa x 00", "v1 rl-aaaaaaaa 1 zz extra"} {
		if _, err := a.Verify(http.Header{Header: {bad}}, "robot-1"); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := NewSigner([]byte("short"), "rl-aaaaaaaa"); err == nil {
		t.Error("a short secret was accepted")
	}
}

func FuzzVerify(f *testing.F) {
	s, _ := NewSigner(NewSecret(), "rl-aaaaaaaa")
	h := http.Header{}
	s.Sign(h, "robot-1")
	f.Add(h.Get(Header), "robot-1")
	f.Add("v1 a 1 b", "")
	f.Fuzz(func(t *testing.T, v, device string) {
		from, err := s.Verify(http.Header{Header: {v}}, device)
		if err == nil && from == "" {
			t.Fatal("accepted a signature without a relay id")
		}
	})
}
