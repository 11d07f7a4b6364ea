package node

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/relay"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/topic"
)

// openTopics makes the relay's topic hub: topics of devices held here
// live here; a topic of a device held elsewhere is fed here once, from
// its holder, for all of this relay's readers. The link to the holders
// reads the fleet member and the peer signer when it is used: both are
// opened after the hub.
func (n *Node) openTopics() error {
	tc := n.cfg.Topics
	tc.Complete()
	tc.Logger = n.log
	tc.Link = &topic.PeerLink{
		Holder: func(device string) (string, string, bool, bool) {
			t, ok := n.member.Route(device, n.cfg.Region, n.forwardVetoed, "")
			return t.ID, t.Address, t.Self, ok
		},
		Sign:            func(h http.Header, device, _ string) { n.signer.Sign(h, device) }, // the signer comes with the fleet
		Client:          &http.Client{Transport: &http.Transport{TLSClientConfig: n.peerTLS.Clone(), Proxy: nil}},
		MaxMessageBytes: tc.MaxMessageBytes,
	}
	hub, err := topic.NewHub(tc)
	if err != nil {
		return fmt.Errorf("topics: %w", err)
	}
	hub.RegisterMetrics(n.registry)
	n.topics = hub
	n.topicHandler = &topic.Handler{Hub: hub, Authorize: n.authorizeTopic, Logger: n.log}
	// The HTTP streams agents mark as broadcasts share the topics'
	// limits, in a hub of their own: a relay's copy of one comes through
	// the holder's like any other request.
	fc := tc
	fc.Link, fc.Backlog = nil, 0
	if n.fanoutHub, err = topic.NewHub(fc); err != nil {
		return fmt.Errorf("topics: %w", err)
	}
	return nil
}

// fanoutTransport shares the streams agents mark as broadcasts: one
// fetch per relay, every viewer here joining it.
func (n *Node) fanoutTransport(next http.RoundTripper) http.RoundTripper {
	n.fanout = &topic.Fanout{
		Next: next,
		Hub:  n.fanoutHub,
		Admit: func(r *http.Request) error {
			if t, ok := access.TicketFrom(r.Context()); ok {
				if err := n.spendCode(t); err != nil {
					return &authError{http.StatusUnauthorized, "this access code was used already; ask for a new one"}
				}
			}
			return nil
		},
		Forwarded: func(r *http.Request) bool { return relay.ForwardedFrom(r.Context()) != "" },
	}
	return n.fanout
}

// closeTopics ends the topics' and shared streams' connections.
func (n *Node) closeTopics() {
	if n.topics != nil {
		n.topics.Close()
	}
	if n.fanoutHub != nil {
		n.fanoutHub.Close()
	}
	if n.fanout != nil {
		n.fanout.Close()
	}
}

// routeTopics serves the topics at /topic/<device>/<name> and passes
// every other request to next. A request that names its device by header
// is the device's own, whatever its path.
func (n *Node) routeTopics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, topic.Prefix) && r.Header.Get("X-Server-Name") == "" {
			n.topicHandler.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// TopicScope is the path, under a device, that an access code's scope
// must cover to open the device's topic name in mode ("read" or
// "write"): a code for "/" opens every topic both ways, one for
// "/.topic/video/read" reads the topic video only.
func TopicScope(name, mode string) string { return "/.topic/" + name + "/" + mode }

// authorizeTopic checks a connection to a topic: another relay's signed
// feed or forward; an access code whose scope covers the topic in the
// mode asked; or a user token that may use the device, or the device's
// own agent token (its programs publish with it), which may read and
// write every topic of the device.
func (n *Node) authorizeTopic(r *http.Request, key topic.Key, mode topic.Mode) (*http.Request, topic.Access, error) {
	if r.Header.Get(peer.Header) != "" {
		_, err := n.verifyPeer(r, key.Device)
		r.Header.Del(peer.Header)
		if err != nil {
			return nil, topic.Access{}, &authError{http.StatusUnauthorized, "a topic connection from another relay was refused: " + err.Error()}
		}
		return r, topic.Access{Peer: true}, nil
	}
	if code, rest := access.TakeCode(r.URL.RawQuery); code != "" {
		r.URL.RawQuery = rest
		return r, topic.Access{}, n.authorizeTopicCode(r, key, mode, code)
	}
	token := relay.UserToken(r.Header)
	if token == "" {
		if n.cfg.AllowAnonymousUsers {
			return r, topic.Access{}, nil
		}
		return nil, topic.Access{}, &authError{http.StatusUnauthorized, "a topic needs a user token, the device's agent token or an access code: send 'Authorization: Bearer <token>' or open the URL with ?code=<access code>"}
	}
	ip, err := n.backoff(r)
	if err != nil {
		return nil, topic.Access{}, err
	}
	p, err := n.tokens.Authenticate(token)
	n.noteAuth(ip, err)
	if err != nil {
		return nil, topic.Access{}, credentialError(err, "user or agent")
	}
	switch {
	case p.Kind == auth.KindAgent && !p.Allows(key.Device):
		return nil, topic.Access{}, &authError{http.StatusForbidden, fmt.Sprintf("this agent token may not use the topics of device %q", key.Device)}
	case p.Kind != auth.KindAgent:
		if err := userMay(p, key.Device); err != nil {
			return nil, topic.Access{}, err
		}
	}
	n.sessions.Bind(r.Context(), p.TokenID)
	return r, topic.Access{}, nil
}

// authorizeTopicCode checks an access code for a topic connection and
// spends it here: a topic's connection meets its topic on the relay it
// reached, and the fleet hears of the use.
func (n *Node) authorizeTopicCode(r *http.Request, key topic.Key, mode topic.Mode, code string) error {
	ip, err := n.backoff(r)
	if err != nil {
		return err
	}
	g, err := access.Decode(n.secrets.VerifyKeys(secret.PurposeCode), access.CodePrefix, code, time.Now())
	n.noteAuth(ip, err)
	if err != nil {
		return &authError{http.StatusUnauthorized, "the access code is not valid (" + reason(err) + "); ask for a new one"}
	}
	for _, m := range []topic.Mode{topic.Read, topic.Write} {
		if mode&m != 0 && !g.Allows(key.Device, TopicScope(key.Name, m.String())) {
			return &authError{http.StatusForbidden, fmt.Sprintf("this access code opens device %q under %q only, not %s of topic %q", g.Device, g.Scope, m, key.Name)}
		}
	}
	p, ok := n.tokens.Principal(g.TokenID)
	if !ok {
		return &authError{http.StatusUnauthorized, "the token this access code was issued to was revoked"}
	}
	if err := userMay(p, key.Device); err != nil {
		return err
	}
	if err := n.spendCode(access.Ticket{Nonce: g.Nonce, Expires: g.Expires}); err != nil {
		return &authError{http.StatusUnauthorized, "this access code was used already; ask for a new one"}
	}
	n.sessions.Bind(r.Context(), g.TokenID)
	return nil
}

// Topics returns the topics on this relay, and the HTTP streams it
// shares, named "GET <path>".
func (n *Node) Topics() []topic.Stats {
	out := n.topics.Stats()
	for _, s := range n.fanoutHub.Stats() {
		s.Name = http.MethodGet + " " + s.Name
		out = append(out, s)
	}
	return out
}
