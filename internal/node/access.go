package node

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/relay"
	"github.com/switchboard-relay/switchboard/internal/secret"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// IssueCode makes a single-use access code for the user p: for device,
// the paths under scope, alive for ttl (0: access.DefaultCodeTTL; at most
// access.MaxCodeTTL). Any relay of the fleet accepts it.
func (n *Node) IssueCode(p auth.Principal, device, scope string, ttl time.Duration) (string, time.Time, error) {
	if err := auth.ValidateDeviceName(device); err != nil {
		return "", time.Time{}, &authError{http.StatusBadRequest, err.Error()}
	}
	scope, err := access.CleanScope(scope)
	if err != nil {
		return "", time.Time{}, &authError{http.StatusBadRequest, err.Error()}
	}
	if svc, ok := strings.CutPrefix(scope, ServiceScope("")); ok && p.AllowsService(device, svc) {
		// A token scoped to the service may pass it on in a code.
	} else if err := userMay(p, device); err != nil {
		return "", time.Time{}, err
	}
	switch {
	case ttl == 0:
		ttl = access.DefaultCodeTTL
	case ttl < time.Second || ttl > access.MaxCodeTTL:
		return "", time.Time{}, &authError{http.StatusBadRequest, fmt.Sprintf("a code lives from 1s to %s; %s was asked", access.MaxCodeTTL, ttl)}
	}
	now := time.Now()
	g := access.Grant{
		Device: device, Scope: scope, TokenID: p.TokenID,
		Issued: now, Expires: now.Add(ttl), Nonce: access.NewNonce(),
	}
	// The encoding keeps whole seconds: round the end down, never past ttl.
	g.Expires = g.Expires.Truncate(time.Second)
	if !g.Expires.After(g.Issued.Truncate(time.Second)) {
		g.Expires = g.Issued.Truncate(time.Second).Add(time.Second)
	}
	return access.Encode(n.secrets.SigningKey(secret.PurposeCode), access.CodePrefix, g), g.Expires, nil
}

// authorizeCode checks an access code for a request to t. The code
// is checked offline against the fleet secret; its single use is enforced
// where the request meets its device (spendCode). A code used for an
// ordinary request opens a session for the page's other requests.
func (n *Node) authorizeCode(r *http.Request, t relay.Target, code string) (*http.Request, error) {
	device := t.Device
	ip, err := n.backoff(r)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	g, err := access.Decode(n.secrets.VerifyKeys(secret.PurposeCode), access.CodePrefix, code, now)
	n.noteAuth(ip, err)
	if err != nil {
		return nil, &authError{http.StatusUnauthorized, "the access code is not valid (" + reason(err) + "); ask for a new one"}
	}
	if !g.Allows(device, t.Path) {
		return nil, &authError{http.StatusForbidden, fmt.Sprintf("this access code opens device %q under %q only", g.Device, g.Scope)}
	}
	p, ok := n.tokens.Principal(g.TokenID)
	if !ok {
		return nil, &authError{http.StatusUnauthorized, "the token this access code was issued to was revoked"}
	}
	if err := userMay(p, device); err != nil {
		return nil, err
	}
	n.sessions.Bind(r.Context(), g.TokenID)
	ctx := access.WithTicket(r.Context(), access.Ticket{Nonce: g.Nonce, Expires: g.Expires})
	if r.Header.Get("Upgrade") == "" && t.ByPath {
		secure := isSecure(r)
		ctx = relay.WithResponseHook(ctx, func(resp *http.Response) {
			if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
				return // refused: a reused code, or the device's own refusal
			}
			resp.Header.Add("Set-Cookie", n.sessionCookie(g, secure).String())
		})
	}
	return r.WithContext(ctx), nil
}

// sessionCookie is the session a code's grant g opens.
func (n *Node) sessionCookie(g access.Grant, secure bool) *http.Cookie {
	now := time.Now()
	s := access.Grant{Device: g.Device, Scope: g.Scope, TokenID: g.TokenID, Issued: now, Expires: now.Add(n.cfg.SessionTTL)}
	path := "/client/" + g.Device + g.Scope
	return &http.Cookie{
		Name:     access.SessionCookie,
		Value:    access.Encode(n.secrets.SigningKey(secret.PurposeCode), access.SessionPrefix, s),
		Path:     path,
		MaxAge:   int(n.cfg.SessionTTL / time.Second),
		HttpOnly: true,
		Secure:   secure,
		SameSite: http.SameSiteStrictMode,
	}
}

// authorizeSession checks the session cookies a browser sent. A websocket
// may use a session only from a page of the same origin: a cookie alone
// would let any site the user visits open one (cross-site websocket
// hijacking).
func (n *Node) authorizeSession(r *http.Request, t relay.Target, values []string) (*http.Request, error) {
	device := t.Device
	ip, err := n.backoff(r)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	path := t.Path
	refused := errors.New("no session cookie for this path")
	for _, v := range values {
		g, err := access.Decode(n.secrets.VerifyKeys(secret.PurposeCode), access.SessionPrefix, v, now)
		if err != nil {
			refused = err
			continue
		}
		if !g.Allows(device, path) {
			continue
		}
		p, ok := n.tokens.Principal(g.TokenID)
		if !ok {
			return nil, &authError{http.StatusUnauthorized, "the token this session was opened for was revoked; open the device with a new access code"}
		}
		if err := userMay(p, device); err != nil {
			return nil, err
		}
		if r.Header.Get("Upgrade") != "" && !sameOrigin(r) {
			return nil, &authError{http.StatusForbidden, fmt.Sprintf("a websocket from another site (Origin %q) may not use the session cookie; use an access code", r.Header.Get("Origin"))}
		}
		n.sessions.Bind(r.Context(), g.TokenID)
		return r, nil
	}
	n.noteAuth(ip, refused)
	return nil, &authError{http.StatusUnauthorized, "the session is not valid here (" + reason(refused) + "); open the device with a new access code"}
}

// subjectCodeSpent tells every relay of a code used, as "<nonce> <unix
// expiry>", so that a code cannot be used again at a relay that takes the
// device over within the code's minute.
const subjectCodeSpent = "switchboard.fleet.code_spent"

// spendCode records the use of a code at the relay holding its device,
// and tells the fleet (best effort: NATS may be away; the holder's own
// record is what enforces the single use).
func (n *Node) spendCode(t access.Ticket) error {
	if err := n.spent.Use(t.Nonce, t.Expires, time.Now()); err != nil {
		return err
	}
	h := http.Header{}
	t.SetHeader(h)
	if err := n.store.Conn().Publish(subjectCodeSpent, []byte(h.Get(access.TicketHeader))); err != nil {
		n.log.Debug("could not tell the fleet of a used access code", logkey.Err, err)
	}
	return nil
}

// subscribeSpentCodes records the codes other relays saw used.
func (n *Node) subscribeSpentCodes() error {
	sub, err := n.store.Conn().Subscribe(subjectCodeSpent, func(m *nats.Msg) {
		if t, ok := access.ParseTicket(string(m.Data)); ok {
			n.spent.Mark(t.Nonce, t.Expires, time.Now())
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe to used access codes: %w", err)
	}
	n.spentSub = sub
	return nil
}

// reason is err's message without the package's common prefix.
func reason(err error) string {
	return strings.TrimPrefix(err.Error(), access.ErrInvalid.Error()+": ")
}

// isSecure reports whether the user reached the relay over TLS (directly
// or through a proxy that says so).
func isSecure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// sameOrigin reports whether r's Origin names the host r was sent to.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// revoked cuts what the token id let in, on this relay: users' requests
// and streams, agents' polls, tunnels and the requests they were answering.
// The token store calls it on every relay as the revocation reaches it.
func (n *Node) revoked(id string) {
	cut := n.sessions.Revoke(id)
	if n.tunnels != nil {
		cut += n.tunnels.CloseAgent(id)
	}
	if n.broker != nil {
		cut += n.broker.FailAgent(id, &broker.Error{Status: http.StatusBadGateway, Err: auth.ErrRevoked,
			Message: "the credential of the agent answering this request was revoked"})
	}
	if cut > 0 {
		n.log.Info("token revoked: cut what it let in", logkey.TokenID, id, logkey.Cut, cut)
	}
}

// ActiveSessions returns how many requests the token id has running here.
func (n *Node) ActiveSessions(id string) int { return n.sessions.Active(id) }
