package relay

import (
	"net/http"
	"net/url"
	"slices"
	"testing"
)

func TestStripCredentials(t *testing.T) {
	const tok = "sbu_0123abcd_secret"
	tests := []struct {
		name      string
		header    http.Header
		query     string
		want      http.Header // what stays
		wantQuery string
	}{
		{"every form at once", http.Header{
			"Authorization":       {"Bearer " + tok, "bearer sba_x_y", "BEARER\t" + tok},
			"X-Switchboard-Token": {tok, tok},
			"Proxy-Authorization": {"Bearer " + tok, "Basic dXNlcjpwdw=="},
			"Cookie":              {"switchboard_session=sbs1_a; theirs=1", "switchboard_session=sbs1_b"},
		}, "", http.Header{"Cookie": {"theirs=1"}}, ""},
		{"the device's own credentials stay", http.Header{
			"Authorization": {"Bearer device-own", "Basic dXNlcjpwdw==", "Bearer " + tok},
			"Cookie":        {"theirs=1; other=2"},
		}, "code=oauth-callback&x=1", http.Header{
			"Authorization": {"Bearer device-own", "Basic dXNlcjpwdw=="},
			"Cookie":        {"theirs=1; other=2"},
		}, "code=oauth-callback&x=1"},
		{"a token inside a value the relay does not parse", http.Header{
			"Authorization": {"Basic dXNlcjpwdw==, Bearer sbu_0123abcd_" + "AAAA", "Bearer device-own"},
		}, "", http.Header{"Authorization": {"Bearer device-own"}}, ""},
		{"relay-internal headers", http.Header{
			"X-Switchboard-Peer": {"v2 forged"}, "X-Switchboard-Hops": {"1"}, "X-Switchboard-Code": {"n 1"},
			"X-Switchboard-Upgrade": {"websocket"}, "x-switchboard-token": {tok}, "X-Other": {"kept"},
		}, "", http.Header{"X-Other": {"kept"}}, ""},
		{"a code in the Referer", http.Header{"Referer": {"https://relay.example/client/dev/ui/?code=sbc1_one&tab=2"}}, "",
			http.Header{"Referer": {"https://relay.example/client/dev/ui/?tab=2"}}, ""},
		{"a Referer without a code", http.Header{"Referer": {"https://relay.example/ui/?code=oauth&x=%20"}}, "",
			http.Header{"Referer": {"https://relay.example/ui/?code=oauth&x=%20"}}, ""},
		{"codes in the query, however escaped", http.Header{},
			"a=1&code=sbc1_one&b=%20&code=sbc1%5Ftwo&%63ode=sbc1_three&code=", http.Header{}, "a=1&b=%20&code="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := &url.URL{Path: "/x", RawQuery: tt.query}
			StripCredentials(tt.header, u)
			for k, v := range tt.want {
				if !slices.Equal(tt.header[k], v) {
					t.Errorf("%s = %q, want %q", k, tt.header[k], v)
				}
			}
			for k := range tt.header {
				if _, ok := tt.want[k]; !ok {
					t.Errorf("%s = %q stayed", k, tt.header[k])
				}
			}
			if u.RawQuery != tt.wantQuery {
				t.Errorf("query %q, want %q", u.RawQuery, tt.wantQuery)
			}
		})
	}
}

// TestUserTokenReadsWhatIsStripped: every token UserToken accepts is one
// StripCredentials removes.
func TestUserTokenReadsWhatIsStripped(t *testing.T) {
	for _, h := range []http.Header{
		{"X-Switchboard-Token": {"anything"}},
		{"Proxy-Authorization": {"bearer anything"}},
		{"Authorization": {"Bearer device-own", "BEARER\tsbu_a_b"}},
	} {
		if UserToken(h) == "" {
			t.Errorf("UserToken(%v) found none", h)
		}
		StripCredentials(h, nil)
		if tok := UserToken(h); tok != "" {
			t.Errorf("after StripCredentials, UserToken finds %q", tok)
		}
	}
}
