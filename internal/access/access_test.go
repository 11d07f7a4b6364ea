package access

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

var (
	key   = []byte("0123456789abcdef0123456789abcdef")
	other = []byte("fedcba9876543210fedcba9876543210")
	t0    = time.Unix(1_800_000_000, 0)
)

func grant() Grant {
	return Grant{Device: "robot-1", Scope: "/", TokenID: "tok1", Issued: t0, Expires: t0.Add(30 * time.Second), Nonce: "n1"}
}

func TestEncodeDecode(t *testing.T) {
	g := grant()
	s := Encode(key, CodePrefix, g)
	got, err := Decode([][]byte{other, key}, CodePrefix, s, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got.Device != g.Device || got.Scope != g.Scope || got.TokenID != g.TokenID || !got.Expires.Equal(g.Expires) || got.Nonce != g.Nonce {
		t.Fatalf("round trip: %+v, want %+v", got, g)
	}
	long := g
	long.Expires = t0.Add(2 * time.Minute)
	noNonce := g
	noNonce.Nonce = ""
	badScope := g
	badScope.Scope = "/a/../b"
	badDevice := g
	badDevice.Device = "a/b"
	tampered := []byte(s)
	tampered[len(CodePrefix)+3] ^= 1
	for _, c := range []struct {
		name   string
		keys   [][]byte
		prefix string
		in     string
		now    time.Time
		want   error
	}{
		{"another key", [][]byte{other}, CodePrefix, s, t0, ErrSignature},
		{"tampered payload", [][]byte{key}, CodePrefix, string(tampered), t0, ErrSignature},
		{"expired", [][]byte{key}, CodePrefix, s, t0.Add(30 * time.Second), ErrExpired},
		{"issued in the future", [][]byte{key}, CodePrefix, s, t0.Add(-time.Minute), ErrExpired},
		{"a code as a session", [][]byte{key}, SessionPrefix, s, t0, ErrMalformed},
		{"a session as a code", [][]byte{key}, CodePrefix, CodePrefix + strings.TrimPrefix(Encode(key, SessionPrefix, g), SessionPrefix), t0, ErrSignature},
		{"a code over a minute", [][]byte{key}, CodePrefix, Encode(key, CodePrefix, long), t0, ErrMalformed},
		{"a code without nonce", [][]byte{key}, CodePrefix, Encode(key, CodePrefix, noNonce), t0, ErrMalformed},
		{"scope with dot segments", [][]byte{key}, CodePrefix, Encode(key, CodePrefix, badScope), t0, ErrMalformed},
		{"invalid device", [][]byte{key}, CodePrefix, Encode(key, CodePrefix, badDevice), t0, ErrMalformed},
		{"no signature", [][]byte{key}, CodePrefix, CodePrefix + "abc", t0, ErrMalformed},
		{"bad base64", [][]byte{key}, CodePrefix, CodePrefix + "!!.!!", t0, ErrMalformed},
		{"too long", [][]byte{key}, CodePrefix, CodePrefix + strings.Repeat("a", MaxEncodedLen), t0, ErrMalformed},
		{"empty", [][]byte{key}, CodePrefix, "", t0, ErrMalformed},
	} {
		if _, err := Decode(c.keys, c.prefix, c.in, c.now); !errors.Is(err, c.want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// Sessions may outlive a minute.
	long.Nonce = ""
	if _, err := Decode([][]byte{key}, SessionPrefix, Encode(key, SessionPrefix, long), t0.Add(time.Minute)); err != nil {
		t.Errorf("a long session: %v", err)
	}
}

func TestAllows(t *testing.T) {
	for _, c := range []struct {
		scope, device, path string
		want                bool
	}{
		{"/", "robot-1", "/anything/at/all", true},
		{"/", "robot-2", "/", false},
		{"/ui", "robot-1", "/ui", true},
		{"/ui", "robot-1", "/ui/app.js", true},
		{"/ui", "robot-1", "/uix", false},
		{"/ui/", "robot-1", "/ui/", true},
		{"/ui/", "robot-1", "/ui/x", true},
		{"/ui/", "robot-1", "/ui", false},
		{"/ui/", "robot-1", "/api", false},
	} {
		g := grant()
		g.Scope = c.scope
		if got := g.Allows(c.device, c.path); got != c.want {
			t.Errorf("scope %q: Allows(%q, %q) = %v", c.scope, c.device, c.path, got)
		}
	}
}

func TestCleanScope(t *testing.T) {
	for in, want := range map[string]string{"": "/", "/": "/", "/ui/": "/ui/", "/a/b": "/a/b"} {
		if got, err := CleanScope(in); err != nil || got != want {
			t.Errorf("CleanScope(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"ui", "/a/../b", "/./x", "/a b", "/a?b", "/a%2Fb", "/" + strings.Repeat("a", 600)} {
		if _, err := CleanScope(bad); err == nil {
			t.Errorf("CleanScope(%q) accepted", bad)
		}
	}
}

func TestTakeCode(t *testing.T) {
	code := CodePrefix + "abc.def"
	for _, c := range []struct{ in, code, rest string }{
		{"code=" + code, code, ""},
		{"a=1&code=" + code + "&b=%20", code, "a=1&b=%20"},
		{"code=oauth&code=" + code, code, "code=oauth"},
		{"code=oauth", "", "code=oauth"},
		{"xcode=" + code, "", "xcode=" + code},
		{"", "", ""},
	} {
		got, rest := TakeCode(c.in)
		if got != c.code || rest != c.rest {
			t.Errorf("TakeCode(%q) = %q, %q; want %q, %q", c.in, got, rest, c.code, c.rest)
		}
	}
}

func TestTakeSession(t *testing.T) {
	h := http.Header{"Cookie": {"a=1; " + SessionCookie + "=s1", SessionCookie + "=s2"}}
	got := TakeSession(h)
	if len(got) != 2 || got[0] != "s1" || got[1] != "s2" {
		t.Errorf("sessions %q", got)
	}
	if v := h.Values("Cookie"); len(v) != 1 || v[0] != "a=1" {
		t.Errorf("left %q", v)
	}
	h = http.Header{"Cookie": {"a=1"}}
	if TakeSession(h) != nil || h.Get("Cookie") != "a=1" {
		t.Errorf("a request without a session was changed: %v", h)
	}
}

func TestSpent(t *testing.T) {
	s := &Spent{Max: 3}
	exp := t0.Add(time.Minute)
	if err := s.Use("a", exp, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Use("a", exp, t0.Add(time.Second)); !errors.Is(err, ErrSpent) {
		t.Fatalf("reuse: %v", err)
	}
	s.Use("b", t0.Add(10*time.Second), t0)
	s.Use("c", exp, t0)
	// Full of live codes: refuse rather than forget one.
	if err := s.Use("d", exp, t0.Add(time.Second)); !errors.Is(err, ErrBusy) {
		t.Fatalf("full: %v", err)
	}
	// Once "b" expired, it makes room; "a" is still refused.
	if err := s.Use("d", exp, t0.Add(11*time.Second)); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if err := s.Use("a", exp, t0.Add(12*time.Second)); !errors.Is(err, ErrSpent) {
		t.Fatalf("reuse after a sweep: %v", err)
	}
	if s.Len() != 3 {
		t.Errorf("remembers %d", s.Len())
	}
}

func TestTicket(t *testing.T) {
	tk := Ticket{Nonce: "abc", Expires: t0}
	h := http.Header{}
	tk.SetHeader(h)
	got, ok := ParseTicket(h.Get(TicketHeader))
	if !ok || got.Nonce != "abc" || !got.Expires.Equal(t0) {
		t.Fatalf("ticket %+v %v", got, ok)
	}
	for _, bad := range []string{"", "abc", " 1", "abc x", strings.Repeat("a", 65) + " 1"} {
		if _, ok := ParseTicket(bad); ok {
			t.Errorf("ParseTicket(%q) accepted", bad)
		}
	}
}

// FuzzDecode: no input panics, allocates beyond its bound or is accepted
// unless it was signed with the key; what is accepted is well formed.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(key, CodePrefix, grant()))
	f.Add(Encode(key, SessionPrefix, grant()))
	f.Add(CodePrefix + "e30.AAAA")
	f.Add(CodePrefix + ".")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		for _, prefix := range []string{CodePrefix, SessionPrefix} {
			g, err := Decode([][]byte{key}, prefix, s, t0.Add(time.Second))
			if err != nil {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("undocumented error %v", err)
				}
				continue
			}
			if Encode(key, prefix, g) != s && len(s) > MaxEncodedLen {
				t.Fatalf("accepted %d bytes", len(s))
			}
			if g.Device == "" || g.Scope == "" || g.Scope[0] != '/' || g.TokenID == "" || !g.Expires.After(t0) {
				t.Fatalf("accepted a malformed grant %+v", g)
			}
		}
	})
}

// FuzzTakeCode: the code taken and the rest give back the query's other
// parameters unchanged, and a taken code always has the prefix.
func FuzzTakeCode(f *testing.F) {
	f.Add("a=1&code=" + CodePrefix + "x.y&b=2")
	f.Add("code=oauth")
	f.Add("&&code=" + CodePrefix + "&")
	f.Fuzz(func(t *testing.T, q string) {
		code, rest := TakeCode(q)
		if code == "" {
			if rest != q {
				t.Fatalf("nothing taken, but %q became %q", q, rest)
			}
			return
		}
		if !strings.HasPrefix(code, CodePrefix) || strings.Contains(code, "&") {
			t.Fatalf("took %q", code)
		}
		parts := strings.Split(q, "&")
		for i, p := range parts {
			if p == CodeParam+"="+code {
				parts = append(parts[:i], parts[i+1:]...)
				break
			}
		}
		if want := strings.Join(parts, "&"); rest != want {
			t.Fatalf("%q: rest %q, want %q", q, rest, want)
		}
	})
}

// FuzzParseTicket: no panic; what is accepted writes back the same.
func FuzzParseTicket(f *testing.F) {
	f.Add("abc 1800000000")
	f.Add(" ")
	f.Fuzz(func(t *testing.T, v string) {
		tk, ok := ParseTicket(v)
		if !ok {
			return
		}
		h := http.Header{}
		tk.SetHeader(h)
		again, ok := ParseTicket(h.Get(TicketHeader))
		if !ok || again != tk {
			t.Fatalf("%q: %+v then %+v", v, tk, again)
		}
	})
}
