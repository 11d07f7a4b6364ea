package limit

import (
	"net/http"
	"net/netip"
	"testing"
)

// FuzzClientIP feeds arbitrary RemoteAddr and X-Forwarded-For values to
// ClientIP: no panic; without trusted proxies the header never matters;
// with them, the answer is the connection's address or one written in the
// header, and never a trusted proxy unless every hop is one.
func FuzzClientIP(f *testing.F) {
	f.Add("203.0.113.9:5678", "198.51.100.7")
	f.Add("10.0.0.1:80", "198.51.100.7, 10.0.0.2")
	f.Add("[2001:db8::1]:443", "::ffff:192.0.2.1,garbage")
	f.Add("not an address", "")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	f.Fuzz(func(t *testing.T, remote, xff string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{"X-Forwarded-For": {xff}}}
		direct := ClientIP(r, nil)
		if direct != remoteIP(remote) {
			t.Fatalf("without trusted proxies %q gave %v, want the connection's %v", xff, direct, remoteIP(remote))
		}
		got := ClientIP(r, trusted)
		if !isTrusted(direct, trusted) && got != direct {
			t.Fatalf("an untrusted connection's header was believed: %v", got)
		}
		_ = Key(got) // any address, valid or not, has a key
	})
}
