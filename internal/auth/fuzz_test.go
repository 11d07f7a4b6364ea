package auth

import (
	"errors"
	"testing"
	"time"
)

// FuzzAuthenticate feeds arbitrary strings to Authenticate: it must never
// panic, must answer with one of its documented errors, and must accept only
// the tokens it issued.
func FuzzAuthenticate(f *testing.F) {
	s := newTokens(f)
	issued := map[string]bool{}
	for _, req := range []CreateRequest{
		{Kind: KindAgent, Devices: []string{"robot-*"}},
		{Kind: KindUser, Name: "alice"},
		{Kind: KindAdmin},
	} {
		secret, _ := mustCreate(f, s, req)
		issued[secret] = true
		f.Add(secret)
		f.Add(secret[:len(secret)-1] + "x")
		f.Add("sbu" + secret[3:])
	}
	f.Add("")
	f.Add("sb")
	f.Add("sbx_________________________________________________________")
	f.Add("sba_00000000_" + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("\xff\xfe")

	f.Fuzz(func(t *testing.T, token string) {
		p, err := s.Authenticate(token)
		switch {
		case err == nil && !issued[token]:
			t.Fatalf("Authenticate accepted %q, which was never issued", token)
		case err == nil && !p.Kind.Valid():
			t.Fatalf("principal of unknown kind %q", p.Kind)
		case err != nil && !errors.Is(err, ErrNoToken) && !errors.Is(err, ErrInvalidToken):
			t.Fatalf("Authenticate(%q) = %v, an undocumented error", token, err)
		case err != nil && issued[token]:
			t.Fatalf("Authenticate refused issued token: %v", err)
		}
	})
}

// FuzzAuthenticateSession feeds arbitrary admin page cookies to
// AuthenticateSession: no panic, only documented errors, and only the
// sessions it made are accepted.
func FuzzAuthenticateSession(f *testing.F) {
	s := newTokens(f)
	_, tok := mustCreate(f, s, CreateRequest{Kind: KindUser, Name: "alice"})
	issued := map[string]bool{}
	for _, ttl := range []time.Duration{time.Hour, 2 * time.Hour} {
		c, err := s.NewSession(tok.ID, ttl)
		if err != nil {
			f.Fatal(err)
		}
		issued[c] = true
		f.Add(c)
		f.Add(c[:len(c)-1])
	}
	f.Add("")
	f.Add("tok.1.x")
	f.Add("..")
	f.Fuzz(func(t *testing.T, cookie string) {
		p, err := s.AuthenticateSession(cookie)
		switch {
		case err == nil && !issued[cookie]:
			t.Fatalf("accepted %q, never issued", cookie)
		case err == nil && p.TokenID != tok.ID:
			t.Fatalf("session of %q", p.TokenID)
		case err != nil && !errors.Is(err, ErrNoToken) && !errors.Is(err, ErrInvalidToken) && !errors.Is(err, ErrSessionExpired):
			t.Fatalf("undocumented error %v", err)
		case err != nil && issued[cookie]:
			t.Fatalf("refused an issued session: %v", err)
		}
	})
}
