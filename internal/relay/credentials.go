package relay

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/access"
)

// UserTokenHeader carries a user's token when the Authorization header is
// needed by the device's own service (kubectl, REST APIs).
const UserTokenHeader = "X-Switchboard-Token"

// reservedPrefix starts the names of the headers relays and agents say
// things to each other with (peer signatures, hops, code tickets, upgrade
// marks). None of them comes from a user, and none reaches a device.
const reservedPrefix = "X-Switchboard-"

// UserToken returns the Switchboard token h carries, without removing it:
// X-Switchboard-Token, else a bearer token in Proxy-Authorization, else an
// Authorization bearer token in Switchboard's format (others are the
// device's business). StripCredentials removes all of these, whichever was
// used.
func UserToken(h http.Header) string {
	if t := strings.TrimSpace(h.Get(UserTokenHeader)); t != "" {
		return t
	}
	for _, v := range h.Values("Proxy-Authorization") {
		if t, ok := Bearer(v); ok {
			return t
		}
	}
	for _, v := range h.Values("Authorization") {
		if t, ok := Bearer(v); ok && looksLikeOurs(t) {
			return t
		}
	}
	return ""
}

// Bearer returns the token of a "Bearer <token>" credential; the scheme
// is matched in any case and may be followed by spaces or tabs.
func Bearer(v string) (string, bool) {
	v = strings.TrimSpace(v)
	i := strings.IndexAny(v, " \t")
	if i < 0 || !strings.EqualFold(v[:i], "Bearer") {
		return "", false
	}
	token := strings.TrimSpace(v[i:])
	return token, token != ""
}

// looksLikeOurs reports whether token has the shape of a Switchboard token
// ("sb" + kind letter + "_").
func looksLikeOurs(token string) bool {
	return len(token) > 4 && token[0] == 's' && token[1] == 'b' && token[3] == '_'
}

// ourTokenShape is a Switchboard token anywhere in a header value.
var ourTokenShape = regexp.MustCompile(`sb[a-z]_[0-9a-f]{8}_`)

// carriesOurs reports whether an Authorization value holds a Switchboard
// token: as its bearer token, or anywhere else in it (a value the relay does
// not parse, such as "Basic x, Bearer sbu_…", is no less a leak).
func carriesOurs(v string) bool {
	if t, ok := Bearer(v); ok && looksLikeOurs(t) {
		return true
	}
	return ourTokenShape.MatchString(v)
}

// StripCredentials removes from a request leaving the relay every
// credential the relay understands, every value of it, whichever one was
// used to let the request in: Proxy-Authorization, Authorization bearer
// tokens of Switchboard's format, the session cookie, access codes in the
// query of u (and in the Referer, where a browser repeats the URL a code
// opened), and every X-Switchboard-* header (UserTokenHeader among
// them). What belongs to the device (its own Authorization, other cookies,
// other "code" parameters) stays as sent.
func StripCredentials(h http.Header, u *url.URL) {
	for k := range h {
		if len(k) >= len(reservedPrefix) && strings.EqualFold(k[:len(reservedPrefix)], reservedPrefix) {
			delete(h, k)
		}
	}
	h.Del("Proxy-Authorization")
	if vv := h.Values("Authorization"); len(vv) > 0 {
		var keep []string
		for _, v := range vv {
			if !carriesOurs(v) {
				keep = append(keep, v)
			}
		}
		h.Del("Authorization")
		for _, v := range keep {
			h.Add("Authorization", v)
		}
	}
	access.TakeSession(h)
	stripRefererCodes(h)
	if u != nil {
		u.RawQuery = access.StripCodes(u.RawQuery)
		if u.RawQuery == "" {
			u.ForceQuery = false
		}
	}
}

// stripRefererCodes takes access codes out of the query of h's Referer.
func stripRefererCodes(h http.Header) {
	ref := h.Get("Referer")
	if !strings.Contains(ref, "?") {
		return
	}
	u, err := url.Parse(ref)
	if err != nil {
		h.Del("Referer") // unparsable: no telling what it carries
		return
	}
	if q := access.StripCodes(u.RawQuery); q != u.RawQuery {
		u.RawQuery = q
		h.Set("Referer", u.String())
	}
}
