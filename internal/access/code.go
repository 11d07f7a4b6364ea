// Package access owns the credentials a user's browser carries instead of
// a token: single-use access codes and the sessions a code opens.
//
// A code is issued by the operator API to a user who holds a token, for
// one device and a path scope, for at most a minute. It is signed with the
// fleet secret, so any relay verifies it offline: no store is read and no
// relay needs to have heard of it. Its single use is enforced where the
// request meets its device, at the relay holding the device (see Spent).
//
// A code used for an ordinary request (not an upgrade) opens a session: a
// cookie, signed the same way, scoped to the device's path, that lets the
// page the code opened load its scripts and images. Sessions and codes both
// name the token they came from, so revoking that token ends them.
package access

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
)

// Prefixes of the encoded credentials: a version, so that the format can
// change, and a kind, so that a session cookie is never taken for a code.
const (
	CodePrefix    = "sbc1_"
	SessionPrefix = "sbs1_"
)

// Limits.
const (
	// MaxCodeTTL is the longest a code lives.
	MaxCodeTTL = 60 * time.Second
	// DefaultCodeTTL is how long a code lives when the issuer asks for no
	// particular time.
	DefaultCodeTTL = 30 * time.Second
	// MaxEncodedLen bounds an encoded code or session; longer input is
	// refused before it is decoded.
	MaxEncodedLen = 1024
	// maxScopeLen bounds the path scope of a grant.
	maxScopeLen = 512
	// clockSkew is how far into the future an issue time may lie.
	clockSkew = 5 * time.Second
)

// CodeParam is the query parameter a code travels in.
const CodeParam = "code"

// Errors of Decode. Each wraps ErrInvalid.
var (
	ErrInvalid   = errors.New("invalid access credential")
	ErrMalformed = fmt.Errorf("%w: malformed", ErrInvalid)
	ErrSignature = fmt.Errorf("%w: not signed by this fleet (forged, or signed with a secret no longer accepted)", ErrInvalid)
	ErrExpired   = fmt.Errorf("%w: expired", ErrInvalid)
	ErrScope     = fmt.Errorf("%w: not valid here", ErrInvalid)
)

// Grant is what a code or a session allows: one device, the paths under
// Scope, until Expires, on behalf of the token TokenID.
type Grant struct {
	Device  string    // the device it opens
	Scope   string    // a path prefix under the device: "/" is every path
	TokenID string    // the token it was issued to; revoking it ends the grant
	Issued  time.Time // when it was made
	Expires time.Time // when it stops working
	Nonce   string    // makes a code unique, for single use; empty in sessions
}

// payload is a grant as encoded, JSON with short names.
type payload struct {
	Device  string `json:"d"`
	Scope   string `json:"s"`
	TokenID string `json:"t"`
	Issued  int64  `json:"i"`
	Expires int64  `json:"e"`
	Nonce   string `json:"n,omitempty"`
}

// NewNonce returns a fresh random nonce for a code.
func NewNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

// CleanScope checks a requested path scope and returns it in its canonical
// form: it starts with "/", has no dot segments, and "" means "/".
func CleanScope(scope string) (string, error) {
	if scope == "" {
		return "/", nil
	}
	if len(scope) > maxScopeLen {
		return "", fmt.Errorf("the path scope has %d characters; at most %d", len(scope), maxScopeLen)
	}
	if scope[0] != '/' {
		return "", fmt.Errorf("the path scope %q must start with '/'", scope)
	}
	for _, seg := range strings.Split(scope, "/") {
		if seg == "." || seg == ".." {
			return "", fmt.Errorf("the path scope %q must not contain '.' or '..' segments", scope)
		}
	}
	for i := range len(scope) {
		if c := scope[i]; c < 0x21 || c == 0x7f || c == '?' || c == '#' || c == '%' {
			return "", fmt.Errorf("the path scope %q may hold neither spaces, control characters, '?', '#' nor escapes", scope)
		}
	}
	return scope, nil
}

// Encode signs g with key under prefix (CodePrefix or SessionPrefix).
func Encode(key []byte, prefix string, g Grant) string {
	body, _ := json.Marshal(payload{
		Device: g.Device, Scope: g.Scope, TokenID: g.TokenID,
		Issued: g.Issued.Unix(), Expires: g.Expires.Unix(), Nonce: g.Nonce,
	}) // a struct of strings and numbers always encodes
	p := base64.RawURLEncoding.EncodeToString(body)
	return prefix + p + "." + base64.RawURLEncoding.EncodeToString(mac(key, prefix, p))
}

func mac(key []byte, prefix, p string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(prefix))
	m.Write([]byte(p))
	return m.Sum(nil)
}

// Decode checks that s is a credential of kind prefix signed with one of
// keys and alive at now, and returns its grant. It allocates at most in
// proportion to MaxEncodedLen.
func Decode(keys [][]byte, prefix, s string, now time.Time) (Grant, error) {
	if len(s) > MaxEncodedLen || !strings.HasPrefix(s, prefix) {
		return Grant{}, ErrMalformed
	}
	p, sig, ok := strings.Cut(s[len(prefix):], ".")
	if !ok {
		return Grant{}, ErrMalformed
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return Grant{}, ErrMalformed
	}
	signed := false
	for _, k := range keys {
		signed = signed || hmac.Equal(got, mac(k, prefix, p))
	}
	if !signed {
		return Grant{}, ErrSignature
	}
	body, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return Grant{}, ErrMalformed
	}
	var pl payload
	if err := json.Unmarshal(body, &pl); err != nil {
		return Grant{}, ErrMalformed
	}
	g := Grant{
		Device: pl.Device, Scope: pl.Scope, TokenID: pl.TokenID,
		Issued: time.Unix(pl.Issued, 0), Expires: time.Unix(pl.Expires, 0), Nonce: pl.Nonce,
	}
	if auth.ValidateDeviceName(g.Device) != nil || g.TokenID == "" || !g.Expires.After(g.Issued) {
		return Grant{}, ErrMalformed
	}
	if sc, err := CleanScope(g.Scope); err != nil || sc != g.Scope {
		return Grant{}, ErrMalformed
	}
	if prefix == CodePrefix && (g.Nonce == "" || g.Expires.Sub(g.Issued) > MaxCodeTTL) {
		return Grant{}, ErrMalformed
	}
	if !now.Before(g.Expires) || g.Issued.After(now.Add(clockSkew)) {
		return Grant{}, ErrExpired
	}
	return g, nil
}

// Allows reports whether g lets a request for path on device through:
// the device is g's and the path is g.Scope or below it.
func (g Grant) Allows(device, path string) bool {
	if device != g.Device {
		return false
	}
	if g.Scope == "/" || path == g.Scope {
		return true
	}
	scope := strings.TrimSuffix(g.Scope, "/")
	return strings.HasPrefix(path, scope+"/")
}

// TakeCode removes the access code from u's query when it carries one of
// Switchboard's (other "code" parameters belong to the device, such as an
// OAuth callback's) and returns it. The rest of the query keeps its exact
// encoding.
func TakeCode(rawQuery string) (code, rest string) {
	if !strings.Contains(rawQuery, CodeParam+"="+CodePrefix) {
		return "", rawQuery
	}
	parts := strings.Split(rawQuery, "&")
	keep := parts[:0]
	for _, part := range parts {
		if v, ok := strings.CutPrefix(part, CodeParam+"="); ok && strings.HasPrefix(v, CodePrefix) && code == "" {
			code = v
			continue
		}
		keep = append(keep, part)
	}
	return code, strings.Join(keep, "&")
}

// StripCodes removes from rawQuery every parameter that carries one of
// Switchboard's access codes, used or not, however its name or value is
// escaped ("code=sbc1_…", "%63ode=sbc1%5F…"), so that a device never sees
// one. Other parameters keep their exact encoding.
func StripCodes(rawQuery string) string {
	if rawQuery == "" {
		return ""
	}
	parts := strings.Split(rawQuery, "&")
	keep := parts[:0]
	for _, part := range parts {
		if !isCodeParam(part) {
			keep = append(keep, part)
		}
	}
	return strings.Join(keep, "&")
}

// isCodeParam reports whether the query parameter part ("name=value",
// escaped) is an access code.
func isCodeParam(part string) bool {
	name, value, ok := strings.Cut(part, "=")
	if !ok {
		return false
	}
	if n, err := url.QueryUnescape(name); err == nil {
		name = n
	}
	if v, err := url.QueryUnescape(value); err == nil {
		value = v
	}
	return name == CodeParam && strings.HasPrefix(strings.TrimSpace(value), CodePrefix)
}

// SessionCookie is the name of the cookie a code's session travels in.
const SessionCookie = "switchboard_session"

// TakeSession removes Switchboard's session cookies from h and returns the
// values, so that the device never sees them. Other cookies stay as sent.
func TakeSession(h http.Header) []string {
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return nil
	}
	var found, keep []string
	for _, line := range lines {
		var rest []string
		for _, c := range strings.Split(line, ";") {
			name, value, _ := strings.Cut(strings.TrimSpace(c), "=")
			if name == SessionCookie {
				found = append(found, value)
				continue
			}
			if strings.TrimSpace(c) != "" {
				rest = append(rest, strings.TrimSpace(c))
			}
		}
		if len(rest) > 0 {
			keep = append(keep, strings.Join(rest, "; "))
		}
	}
	if found == nil {
		return nil
	}
	h.Del("Cookie")
	for _, line := range keep {
		h.Add("Cookie", line)
	}
	return found
}
