package node

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/auth"
)

// UserTokenHeader carries a user's token when the Authorization header is
// needed by the device's own service (kubectl, REST APIs).
const UserTokenHeader = "X-Switchboard-Token"

// authError is a refused credential, answered 401 or 403.
type authError struct {
	status int
	msg    string
}

func (e *authError) Error() string   { return e.msg }
func (e *authError) HTTPStatus() int { return e.status }

// authorizeAgent checks an agent's bearer token against device.
func (n *Node) authorizeAgent(r *http.Request, device string) (string, error) {
	token, _ := bearer(r.Header.Get("Authorization"))
	if token == "" {
		if n.cfg.AllowAnonymousAgents {
			return "", nil
		}
		return "", &authError{http.StatusUnauthorized, "this relay needs an agent token: create one with 'switchboard ctl tokens create --device " + device + "' and pass it with --token-file"}
	}
	p, err := n.tokens.AuthenticateKind(token, auth.KindAgent)
	if err != nil {
		return "", credentialError(err, "agent")
	}
	if !p.Allows(device) {
		return "", &authError{http.StatusForbidden, fmt.Sprintf("this agent token may not serve device %q", device)}
	}
	return p.TokenID, nil
}

// authorizeUser checks a user's token against device and removes it from the
// request so that the device never sees it.
func (n *Node) authorizeUser(r *http.Request, device string) error {
	token := userToken(r.Header)
	if token == "" {
		if n.cfg.AllowAnonymousUsers {
			return nil
		}
		return &authError{http.StatusUnauthorized, "this relay needs a user token: send 'Authorization: Bearer <token>' or '" + UserTokenHeader + ": <token>'; an operator creates one with 'switchboard ctl tokens create --user NAME'"}
	}
	p, err := n.tokens.Authenticate(token)
	if err != nil {
		return credentialError(err, "user")
	}
	if p.Kind == auth.KindAgent {
		return &authError{http.StatusForbidden, "this is an agent token; users need a user token"}
	}
	if !p.Allows(device) {
		return &authError{http.StatusForbidden, fmt.Sprintf("this token may not use device %q", device)}
	}
	return nil
}

// userToken takes a Switchboard token from h: X-Switchboard-Token,
// Proxy-Authorization, or an Authorization bearer token in Switchboard's
// format (others are the device's business and stay). It removes what it took.
func userToken(h http.Header) string {
	if t := h.Get(UserTokenHeader); t != "" {
		h.Del(UserTokenHeader)
		return t
	}
	if t, ok := bearer(h.Get("Proxy-Authorization")); ok {
		h.Del("Proxy-Authorization")
		return t
	}
	if t, ok := bearer(h.Get("Authorization")); ok && looksLikeOurs(t) {
		h.Del("Authorization")
		return t
	}
	return ""
}

// bearer returns the token of an "Authorization: Bearer <token>" value.
func bearer(v string) (string, bool) {
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// looksLikeOurs reports whether token has the shape of a Switchboard token
// ("sb" + kind letter + "_").
func looksLikeOurs(token string) bool {
	return len(token) > 4 && token[0] == 's' && token[1] == 'b' && token[3] == '_'
}

func credentialError(err error, who string) error {
	if errors.Is(err, auth.ErrWrongKind) {
		return &authError{http.StatusForbidden, err.Error()}
	}
	return &authError{http.StatusUnauthorized, "the " + who + " token is not valid (unknown, revoked or malformed)"}
}
