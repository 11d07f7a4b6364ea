package auth

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/store"
)

func TestSession(t *testing.T) {
	s := newTokens(t)
	_, admin := mustCreate(t, s, CreateRequest{Kind: KindAdmin, Name: "ops"})
	cookie, err := s.NewSession(admin.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cookie, admin.ID+".") {
		t.Fatalf("cookie %q does not start with the token id", cookie)
	}
	p, err := s.AuthenticateSession(cookie)
	if err != nil || p.TokenID != admin.ID || p.Kind != KindAdmin || p.Name != "ops" {
		t.Fatalf("AuthenticateSession = %+v, %v", p, err)
	}
}

func TestSessionHoldsNoSecret(t *testing.T) {
	s := newTokens(t)
	secret, admin := mustCreate(t, s, CreateRequest{Kind: KindAdmin})
	cookie, err := s.NewSession(admin.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(cookie, secret[len(secret)-secretLen:]) {
		t.Fatalf("cookie %q carries the token's secret", cookie)
	}
}

func TestSessionRefused(t *testing.T) {
	s := newTokens(t)
	_, admin := mustCreate(t, s, CreateRequest{Kind: KindAdmin})
	// The "uppercase id" case needs an id with a letter in it; one in
	// forty random ids has none.
	for i := 0; !strings.ContainsAny(admin.ID, "abcdef"); i++ {
		if i == 100 {
			t.Fatalf("100 token ids without a letter, the last %q", admin.ID)
		}
		_, admin = mustCreate(t, s, CreateRequest{Kind: KindAdmin})
	}
	_, other := mustCreate(t, s, CreateRequest{Kind: KindAdmin})
	now := time.Now()
	good, err := s.newSession(admin.ID, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(good, ".")
	id, exp, mac := parts[0], parts[1], parts[2]
	flip := func(s string) string { // changes the last character
		c := byte('A')
		if s[len(s)-1] == 'A' {
			c = 'B'
		}
		return s[:len(s)-1] + string(c)
	}
	later := strconv.FormatInt(now.Add(48*time.Hour).Unix(), 10)
	expired, err := s.newSession(admin.ID, now.Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		cookie  string
		wantErr error
	}{
		{"empty", "", ErrNoToken},
		{"expired", expired, ErrSessionExpired},
		{"expiry changed", id + "." + later + "." + mac, ErrInvalidToken},
		{"expiry with plus sign", id + ".+" + exp + "." + mac, ErrInvalidToken},
		{"expiry with leading zero", id + ".0" + exp + "." + mac, ErrInvalidToken},
		{"mac changed", id + "." + exp + "." + flip(mac), ErrInvalidToken},
		{"mac padded", good + "=", ErrInvalidToken},
		{"mac truncated", good[:len(good)-1], ErrInvalidToken},
		{"other token's id", other.ID + "." + exp + "." + mac, ErrInvalidToken},
		{"unknown id", "00000000." + exp + "." + mac, ErrInvalidToken},
		{"uppercase id", strings.ToUpper(id) + "." + exp + "." + mac, ErrInvalidToken},
		{"extra part", good + ".x", ErrInvalidToken},
		{"two parts", id + "." + exp, ErrInvalidToken},
		{"the token itself", "sbx_" + id + "_" + strings.Repeat("A", secretLen), ErrInvalidToken},
		{"oversized", good + strings.Repeat("A", maxSessionCookie), ErrInvalidToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.authenticateSession(tt.cookie, now); !errors.Is(err, tt.wantErr) {
				t.Fatalf("authenticateSession(%q) = %v, want %v", tt.cookie, err, tt.wantErr)
			}
		})
	}
	if _, err := s.authenticateSession(good, now); err != nil {
		t.Fatalf("the untouched cookie is refused: %v", err)
	}
	if _, err := s.authenticateSession(good, now.Add(time.Hour)); !errors.Is(err, ErrSessionExpired) {
		t.Fatalf("at its expiry the cookie gives %v, want ErrSessionExpired", err)
	}
}

func TestSessionEndsWithRevocation(t *testing.T) {
	s := newTokens(t)
	_, admin := mustCreate(t, s, CreateRequest{Kind: KindAdmin})
	cookie, err := s.NewSession(admin.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(testContext(t), admin.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthenticateSession(cookie); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a revoked token's session gives %v, want ErrInvalidToken", err)
	}
	if _, err := s.NewSession(admin.ID, time.Hour); !errors.Is(err, ErrNotFound) {
		t.Fatalf("NewSession for a revoked token = %v, want ErrNotFound", err)
	}
}

// TestSessionAcrossRelays checks that a session made on one relay is accepted
// by another relay of the fleet, which shares only the bucket, and that a
// revocation made on the second ends it on the first.
func TestSessionAcrossRelays(t *testing.T) {
	st := openNATS(t, store.Config{})
	a, b := openTokens(t, st), openTokens(t, st)
	_, admin := mustCreate(t, a, CreateRequest{Kind: KindAdmin})
	cookie, err := a.NewSession(admin.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		_, err := b.AuthenticateSession(cookie)
		return err
	})
	if err := b.Revoke(testContext(t), admin.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		if _, err := a.AuthenticateSession(cookie); !errors.Is(err, ErrInvalidToken) {
			return errors.New("the first relay still accepts the session")
		}
		return nil
	})
}

func TestNewSessionRefusesNonPositiveLifetime(t *testing.T) {
	s := newTokens(t)
	_, admin := mustCreate(t, s, CreateRequest{Kind: KindAdmin})
	if _, err := s.NewSession(admin.ID, 0); err == nil {
		t.Fatal("NewSession with a zero lifetime succeeded")
	}
}
