package auth

import (
	"errors"
	"testing"
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
