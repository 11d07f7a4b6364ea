package node

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/limit"
	"github.com/switchboard-relay/switchboard/internal/relay"
)

// UserTokenHeader carries a user's token when the Authorization header is
// needed by the device's own service (kubectl, REST APIs).
const UserTokenHeader = relay.UserTokenHeader

// authError is a refused credential, answered 401 or 403.
type authError struct {
	status int
	msg    string
}

func (e *authError) Error() string   { return e.msg }
func (e *authError) HTTPStatus() int { return e.status }

// authorizeAgent checks an agent's bearer token against device, and files
// the request under the token, so that revoking it cuts the request.
func (n *Node) authorizeAgent(r *http.Request, device string) (string, error) {
	token, _ := relay.Bearer(r.Header.Get("Authorization"))
	if token == "" {
		if n.cfg.AllowAnonymousAgents {
			return "", nil
		}
		return "", &authError{http.StatusUnauthorized, "this relay needs an agent token: create one with 'switchboard ctl tokens create --device " + device + "' and pass it with --token-file"}
	}
	ip, err := n.backoff(r)
	if err != nil {
		return "", err
	}
	p, err := n.tokens.AuthenticateKind(token, auth.KindAgent)
	n.noteAuth(ip, err)
	if err != nil {
		return "", credentialError(err, "agent")
	}
	if !p.Allows(device) {
		return "", &authError{http.StatusForbidden, fmt.Sprintf("this agent token may not serve device %q", device)}
	}
	n.sessions.Bind(r.Context(), p.TokenID)
	return p.TokenID, nil
}

// authorizeUser checks a user's credential against the device of t, the
// request's parsed address. The relay
// removes every credential from the request before it leaves (see
// relay.StripCredentials), whichever was used. The credential is an
// access code in the query, a user (or admin) token in a header, or the
// session cookie a code opened, in that order.
func (n *Node) authorizeUser(r *http.Request, t relay.Target) (*http.Request, error) {
	device := t.Device
	if code, rest := access.TakeCode(r.URL.RawQuery); code != "" {
		r.URL.RawQuery = rest
		r.URL.ForceQuery = false
		if path, q, ok := strings.Cut(r.RequestURI, "?"); ok { // never logged, never passed on
			if _, q = access.TakeCode(q); q != "" {
				path += "?" + q
			}
			r.RequestURI = path
		}
		return n.authorizeCode(r, t, code)
	}
	token := relay.UserToken(r.Header) // relay.StripCredentials takes it off
	sessions := access.TakeSession(r.Header)
	if token == "" && len(sessions) > 0 && !n.cfg.AllowAnonymousUsers {
		return n.authorizeSession(r, t, sessions)
	}
	if token == "" {
		if n.cfg.AllowAnonymousUsers {
			return r, nil
		}
		return nil, &authError{http.StatusUnauthorized, "this relay needs a user token or an access code: send 'Authorization: Bearer <token>' or '" + UserTokenHeader + ": <token>', or open the URL with ?code=<access code>; an operator creates tokens with 'switchboard ctl tokens create --user NAME'"}
	}
	ip, err := n.backoff(r)
	if err != nil {
		return nil, err
	}
	p, err := n.tokens.Authenticate(token)
	n.noteAuth(ip, err)
	if err != nil {
		return nil, credentialError(err, "user")
	}
	if err := userMay(p, device); err != nil {
		return nil, err
	}
	n.sessions.Bind(r.Context(), p.TokenID)
	return r, nil
}

// backoff refuses (429) a client address that presented too many invalid
// credentials lately; it returns the address for noteAuth.
func (n *Node) backoff(r *http.Request) (netip.Addr, error) {
	ip := limit.ClientIP(r, nil)
	return ip, n.authFails.Check(ip)
}

// noteAuth counts the outcome of checking a credential presented from ip:
// an invalid one is a failure; a valid one of the wrong kind is not.
func (n *Node) noteAuth(ip netip.Addr, err error) {
	switch {
	case err == nil:
		n.authFails.Succeed(ip)
	case errors.Is(err, auth.ErrInvalidToken) || errors.Is(err, access.ErrInvalid):
		n.authFails.Fail(ip)
	}
}

// userMay checks that the principal p is a user (or admin) allowed device.
func userMay(p auth.Principal, device string) error {
	if p.Kind == auth.KindAgent {
		return &authError{http.StatusForbidden, "this is an agent token; users need a user token"}
	}
	if !p.Allows(device) {
		return &authError{http.StatusForbidden, fmt.Sprintf("this token may not use device %q", device)}
	}
	return nil
}

func credentialError(err error, who string) error {
	if errors.Is(err, auth.ErrWrongKind) {
		return &authError{http.StatusForbidden, err.Error()}
	}
	return &authError{http.StatusUnauthorized, "the " + who + " token is not valid (unknown, revoked or malformed)"}
}
