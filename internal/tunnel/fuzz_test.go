package tunnel

import (
	"net/url"
	"testing"
)

// FuzzParseRelays feeds arbitrary relay-list headers to ParseRelays: no
// panic, at most maxRelays entries, each an http(s) URL with a host, and a
// list it returns survives FormatRelays and ParseRelays unchanged when
// FormatRelays keeps every entry.
func FuzzParseRelays(f *testing.F) {
	f.Add("rl-aaaaaaaa=http://127.0.0.1:8080,rl-bbbbbbbb=https://relay-2.example.com")
	f.Add("a=b,=http://x,c=ftp://y, d = http://z ,,")
	f.Add("x=http://[::1]:80/path?q=1")
	f.Fuzz(func(t *testing.T, v string) {
		rs := ParseRelays(v)
		if len(rs) > maxRelays {
			t.Fatalf("%d relays", len(rs))
		}
		for _, r := range rs {
			u, err := url.Parse(r.URL)
			if r.ID == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				t.Fatalf("accepted %+v", r)
			}
		}
		enc := FormatRelays(rs)
		again := ParseRelays(enc)
		if FormatRelays(again) != enc {
			t.Fatalf("%q: formatted %q, then %q", v, enc, FormatRelays(again))
		}
	})
}
