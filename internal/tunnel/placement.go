package tunnel

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Headers of the tunnel handshake that place an agent in the fleet.
const (
	// RelayIDHeader names, in the relay's answer, the relay the agent reached.
	RelayIDHeader = "X-Switchboard-Relay-Id"
	// RelaysHeader lists, in the relay's answer, the fleet's relays best
	// first for the agent's device, as "id=url" items separated by commas:
	// the list the agent walks when its relay is lost.
	RelaysHeader = "X-Switchboard-Relays"
	// UnreachableHeader names, in the agent's handshake, the id of the relay
	// it just lost without a word (its pings went unanswered, or it refused
	// the agent's connection): the relay placing the agent leaves it out.
	UnreachableHeader = "X-Switchboard-Unreachable"
	// LostHeader says, in the agent's handshake, how many milliseconds ago
	// it lost its previous relay: the relay that takes it records how long
	// the device's move took.
	LostHeader = "X-Switchboard-Lost-Ms"
	// HolderHeader names, in a redirect, the id of the relay redirected to.
	HolderHeader = "X-Switchboard-Holder"
	// RedirectedHeader marks a handshake that follows a redirect: the relay
	// takes the agent rather than sending it on again.
	RedirectedHeader = "X-Switchboard-Redirected"
	// StandbyHeader names, in the answer of a relay that took a tunnel,
	// the id of the relay the agent should keep a standby tunnel to (one
	// of RelaysHeader's); absent, the agent keeps none.
	StandbyHeader = "X-Switchboard-Standby"
)

// Placement is a relay's answer to "where should this agent be".
type Placement struct {
	// Redirect is the base URL of the relay that should hold the device,
	// when it is not this one; empty takes the agent here. Holder is its id.
	Redirect string
	Holder   string
	// RelayID is this relay's id.
	RelayID string
	// Relays are the fleet's relays, best first for the device.
	Relays []RelayAddr
	// Refuse, when set, turns the agent away with 503 and this message
	// (and Retry-After), to try again elsewhere; Redirect is then unused.
	Refuse string
	// Standby is the id of the relay the agent should keep a standby
	// tunnel to, for an agent taken here; "" for none.
	Standby string
}

// RelayAddr is one relay of the fleet as an agent knows it.
type RelayAddr struct {
	ID  string
	URL string
}

// FormatRelays encodes a relay list for RelaysHeader.
func FormatRelays(rs []RelayAddr) string {
	items := make([]string, 0, len(rs))
	for _, r := range rs {
		if r.ID == "" || r.URL == "" || strings.ContainsAny(r.ID+r.URL, ",= \t") {
			continue
		}
		items = append(items, r.ID+"="+r.URL)
	}
	return strings.Join(items, ",")
}

// maxRelays bounds the relay list an agent accepts.
const maxRelays = 64

// ParseRelays decodes RelaysHeader, skipping malformed items.
func ParseRelays(v string) []RelayAddr {
	var out []RelayAddr
	for _, item := range strings.Split(v, ",") {
		id, raw, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || id == "" || len(out) == maxRelays {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			continue
		}
		out = append(out, RelayAddr{ID: id, URL: raw})
	}
	return out
}

// RedirectError is a handshake answered with a redirect to the relay that
// holds the device.
type RedirectError struct {
	Location *url.URL // the holder's base URL
	Holder   string   // the holder's id
	RelayID  string   // the relay that redirected
	Relays   []RelayAddr
}

func (e *RedirectError) Error() string {
	return fmt.Sprintf("relay %s sent the agent to %s, which holds the device", e.RelayID, e.Location.Redacted())
}

// Placed is what an agent learns from a relay that took its tunnel.
type Placed struct {
	RelayID string
	Relays  []RelayAddr
	Standby string // the relay to keep a standby tunnel to, or ""
}

// RedirectFromResponse turns a 307 answer to a websocket tunnel handshake
// into a *RedirectError.
func RedirectFromResponse(resp *http.Response) error { return redirectFrom(resp) }

// PlacedFromHeader reads a successful handshake's answer headers.
func PlacedFromHeader(h http.Header) Placed { return placedFrom(h) }

// placedFrom reads a successful handshake's answer.
func placedFrom(h http.Header) Placed {
	p := Placed{RelayID: h.Get(RelayIDHeader), Relays: ParseRelays(h.Get(RelaysHeader))}
	if sb := h.Get(StandbyHeader); validHeaderToken(sb) {
		p.Standby = sb
	}
	return p
}

// redirectFrom turns a 307 answer into a *RedirectError.
func redirectFrom(resp *http.Response) error {
	loc, err := resp.Location()
	if err != nil {
		return fmt.Errorf("tunnel handshake: redirect without a usable Location: %w", err)
	}
	if loc.Scheme != "http" && loc.Scheme != "https" {
		return fmt.Errorf("tunnel handshake: redirect to %q, not an http(s) URL", loc.Redacted())
	}
	return &RedirectError{Location: loc, Holder: resp.Header.Get(HolderHeader), RelayID: resp.Header.Get(RelayIDHeader), Relays: ParseRelays(resp.Header.Get(RelaysHeader))}
}

// IsRedirect reports whether err is a *RedirectError, and returns it.
func IsRedirect(err error) (*RedirectError, bool) {
	var re *RedirectError
	ok := errors.As(err, &re)
	return re, ok
}

// validHeaderToken reports whether v, a relay id, is short and plain
// enough to travel in a header and a stream's metadata.
func validHeaderToken(v string) bool {
	if v == "" || len(v) > 64 {
		return false
	}
	for i := range len(v) {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
