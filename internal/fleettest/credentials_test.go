package fleettest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/peer"
)

// recordingBackend is a device's service that keeps what each request
// showed it (headers and request target), by the test's Case-Id header.
type recordingBackend struct {
	mu   sync.Mutex // guards seen
	seen map[string]seenRequest
}

// seenRequest is what the device got of one request.
type seenRequest struct {
	header http.Header
	target string // the request target, query included
}

func (b *recordingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.seen[r.Header.Get("Case-Id")] = seenRequest{header: r.Header.Clone(), target: r.RequestURI}
	b.mu.Unlock()
	if r.Header.Get("Upgrade") != "" {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.Close(websocket.StatusNormalClosure, "seen")
		return
	}
	io.WriteString(w, "seen\n")
}

func (b *recordingBackend) take(id string) (seenRequest, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.seen[id]
	delete(b.seen, id)
	return s, ok
}

// credEnv is one relay a user reaches (directly or as the entry of a
// forward), with the credentials valid there.
type credEnv struct {
	entry  *Relay // where the user sends the request
	issuer *Relay // a relay that issues codes (same fleet)
	tokens []string
}

// credCase is a request's credentials: headers, and whether it carries a
// fresh access code in its query or the session cookie.
type credCase struct {
	name    string
	header  func(tok []string) http.Header
	code    int  // access codes to put in the query
	cookie  bool // send the session cookie
	ownAuth bool // the device's own Authorization must arrive
}

// credCases are every combination of the three credential headers with
// every casing of the bearer scheme, and the other forms the relay reads.
func credCases() []credCase {
	var cases []credCase
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		for set := 1; set < 8; set++ {
			a, x, p := set&1 != 0, set&2 != 0, set&4 != 0
			cases = append(cases, credCase{
				name: fmt.Sprintf("%s/auth=%v,token=%v,proxy=%v", scheme, a, x, p),
				header: func(tok []string) http.Header {
					h := http.Header{}
					if a {
						h.Set("Authorization", scheme+" "+tok[0])
					}
					if x {
						h.Set("X-Switchboard-Token", tok[1])
					}
					if p {
						h.Set("Proxy-Authorization", scheme+" "+tok[2])
					}
					return h
				},
			})
		}
	}
	return append(cases,
		credCase{name: "two Authorization values, the device's first", ownAuth: true, header: func(tok []string) http.Header {
			return http.Header{"Authorization": {"Bearer device-own", "Bearer " + tok[0]}}
		}},
		credCase{name: "device's Authorization and a token header", ownAuth: true, header: func(tok []string) http.Header {
			return http.Header{"Authorization": {"Bearer device-own"}, "X-Switchboard-Token": {tok[1], tok[2]}}
		}},
		credCase{name: "tab after the scheme", header: func(tok []string) http.Header {
			return http.Header{"Authorization": {"Bearer\t" + tok[0]}, "Proxy-Authorization": {"bearer " + tok[2], "Bearer " + tok[1]}}
		}},
		credCase{name: "lower-case names", header: func(tok []string) http.Header {
			return http.Header{"x-switchboard-token": {tok[1]}, "authorization": {"bEaReR " + tok[0]}}
		}},
		credCase{name: "relay-internal headers", header: func(tok []string) http.Header {
			return http.Header{"X-Switchboard-Token": {tok[1]}, "X-Switchboard-Hops": {"1"},
				"X-Switchboard-Code": {"forged 1"}, "X-Switchboard-Upgrade": {"x"}}
		}},
		credCase{name: "code", code: 1, header: func([]string) http.Header { return http.Header{} }},
		credCase{name: "two codes and a token", code: 2, header: func(tok []string) http.Header {
			return http.Header{"Authorization": {"Bearer " + tok[0]}}
		}},
		credCase{name: "session cookie", cookie: true, header: func([]string) http.Header { return http.Header{} }},
		credCase{name: "session cookie and a token", cookie: true, header: func(tok []string) http.Header {
			return http.Header{"X-Switchboard-Token": {tok[1]}}
		}},
	)
}

// credWay is a way into the relay: it sends a GET of target with h
// through env and reports the status.
type credWay struct {
	name   string
	tls    bool
	signed bool         // as another relay forwards it, signed, to the holder
	client *http.Client // for sessionFor
	entry  func(e credEnv) *Relay
	send   func(t *testing.T, base, target string, h http.Header) (int, error)
}

func httpWay(c *http.Client) func(t *testing.T, base, target string, h http.Header) (int, error) {
	return func(t *testing.T, base, target string, h http.Header) (int, error) {
		req, err := http.NewRequest(http.MethodGet, base+target, nil)
		if err != nil {
			return 0, err
		}
		req.Header = h
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
}

func wsWay(c *http.Client) func(t *testing.T, base, target string, h http.Header) (int, error) {
	return func(t *testing.T, base, target string, h http.Header) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if h.Get("Origin") == "" {
			h.Set("Origin", base) // a page of the relay's own, for the session cookie
		}
		conn, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+target, &websocket.DialOptions{HTTPClient: c, HTTPHeader: h})
		if err != nil {
			if resp != nil {
				return resp.StatusCode, nil
			}
			return 0, err
		}
		conn.CloseNow()
		return resp.StatusCode, nil
	}
}

// TestDeviceSeesNoCredential sends every combination of the credentials
// the relay understands through every way in, to devices behind both agent
// protocols, and checks that the device (a real backend recording its
// requests) sees none of them, while what is its own arrives.
func TestDeviceSeesNoCredential(t *testing.T) {
	b := &recordingBackend{seen: map[string]seenRequest{}}
	backend := httptestServer(t, b)
	devices := map[string]string{"nat": agent.ProtocolNative, "lp": agent.ProtocolLongPoll}

	// A fleet of two plain relays: HTTP/1.1, h2c, websockets, forwards.
	relays := StartFleet(t, 2)
	plain := map[string]credEnv{}
	for dev, proto := range devices {
		holder, others := HolderFor(t, relays, dev)
		StartAgent(t, holder, dev, backend, holder.Token(t, auth.KindAgent, dev+" agent", dev), protocol(proto))
		waitHolder(t, relays, dev, holder)
		plain[dev] = credEnv{entry: holder, issuer: others[0]}
	}
	plainTokens := []string{
		FleetToken(t, relays, auth.KindUser, "alice", "nat", "lp"),
		FleetToken(t, relays, auth.KindUser, "all devices"),
		relays[0].AdminToken,
	}
	// A TLS relay: HTTP/1.1 and HTTP/2 by ALPN.
	ca := NewCA(t)
	tr := StartTLSRelay(t, ca)
	for dev, proto := range devices {
		StartAgent(t, tr, dev, backend, tr.Token(t, auth.KindAgent, dev+" agent", dev), protocol(proto), trusting(ca))
		tr.WaitDevice(t, dev)
	}
	tlsTokens := []string{tr.Token(t, auth.KindUser, "alice", "nat", "lp"), tr.Token(t, auth.KindUser, "all devices"), tr.AdminToken}

	h2c := &http.Transport{Protocols: new(http.Protocols)}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(h2c.CloseIdleConnections)
	h1 := NewClient(t, true)
	holderOf := func(e credEnv) *Relay { return e.entry }
	otherOf := func(e credEnv) *Relay { return e.issuer }
	tls1, tls2 := ca.Client(t, false), ca.Client(t, true)
	ways := []credWay{
		{name: "http1", client: h1, entry: holderOf, send: httpWay(h1)},
		{name: "h2c", client: h1, entry: holderOf, send: httpWay(&http.Client{Transport: h2c, Timeout: 30 * time.Second})},
		{name: "websocket", client: h1, entry: holderOf, send: wsWay(h1)},
		{name: "forwarded", client: h1, entry: otherOf, send: httpWay(h1)},
		{name: "forwarded websocket", client: h1, entry: otherOf, send: wsWay(h1)},
		{name: "signed forward straight to the holder", signed: true, client: h1, entry: holderOf, send: httpWay(h1)},
		{name: "tls http1", tls: true, client: tls1, send: httpWay(tls1)},
		{name: "tls h2", tls: true, client: tls1, send: httpWay(tls2)},
	}

	n := 0
	for _, w := range ways {
		for dev := range devices {
			env, toks := plain[dev], plainTokens
			if w.tls {
				env, toks = credEnv{entry: tr, issuer: tr}, tlsTokens
			}
			entry := env.entry
			if w.entry != nil {
				entry = w.entry(env)
			}
			cookie := sessionFor(t, env.issuer, w.client, toks[0], dev)
			for _, c := range credCases() {
				n++
				id := fmt.Sprint(n)
				h := c.header(toks)
				h.Set("Case-Id", id)
				secrets := append([]string{cookie}, toks...)
				target := "/client/" + dev + "/seen"
				for i := range c.code {
					code := codeFor(t, env.issuer, toks[0], dev)
					secrets = append(secrets, code)
					h.Set("Referer", "http://relay.example/client/"+dev+"/?code="+code+"&tab=1") // a page's next request
					target += map[bool]string{true: "?", false: "&"}[i == 0] + "code=" + url.QueryEscape(code)
				}
				if c.code > 0 || c.cookie {
					target += map[bool]string{true: "?", false: "&"}[c.code == 0] + "keep=1"
				}
				if c.cookie {
					h.Add("Cookie", "theirs=1; "+access.SessionCookie+"="+cookie)
				}
				if w.signed {
					// What another relay sends is stripped again here.
					signer, err := peer.NewSigner(entry.Node.Secrets(), env.issuer.Node.Fleet().ID())
					if err != nil {
						t.Fatal(err)
					}
					signer.Sign(h, dev)
				}
				status, err := w.send(t, strings.TrimSuffix(entry.URL, "/"), target, h)
				if err != nil || (status != http.StatusOK && status != http.StatusSwitchingProtocols) {
					t.Errorf("%s to %s, %s: status %d, err %v", w.name, dev, c.name, status, err)
					continue
				}
				seen, ok := b.take(id)
				if !ok {
					t.Errorf("%s to %s, %s: the device saw no request", w.name, dev, c.name)
					continue
				}
				checkSeen(t, fmt.Sprintf("%s to %s, %s", w.name, dev, c.name), seen, secrets, c)
			}
		}
	}
}

// checkSeen fails when the device saw a credential or a relay-internal
// header, or missed what was its own.
func checkSeen(t *testing.T, what string, seen seenRequest, secrets []string, c credCase) {
	t.Helper()
	dump := fmt.Sprint(seen.header) + " " + seen.target
	for _, s := range secrets {
		if s != "" && strings.Contains(dump, s) {
			t.Errorf("%s: the device saw a credential: %s", what, dump)
			return
		}
	}
	for k := range seen.header {
		if strings.HasPrefix(strings.ToLower(k), "x-switchboard-") || strings.EqualFold(k, "Proxy-Authorization") {
			t.Errorf("%s: the device got the header %s", what, k)
		}
	}
	if c.ownAuth && seen.header.Get("Authorization") != "Bearer device-own" {
		t.Errorf("%s: the device's own Authorization did not arrive: %q", what, seen.header.Values("Authorization"))
	}
	if c.cookie && !strings.Contains(seen.header.Get("Cookie"), "theirs=1") {
		t.Errorf("%s: the device's own cookie did not arrive: %q", what, seen.header.Values("Cookie"))
	}
	if (c.code > 0 || c.cookie) && !strings.Contains(seen.target, "keep=1") {
		t.Errorf("%s: the device's own query did not arrive: %s", what, seen.target)
	}
}

// codeFor issues at r a code for device, as the holder of token.
func codeFor(t *testing.T, r *Relay, token, device string) string {
	t.Helper()
	p, err := r.Node.Tokens().Authenticate(token)
	if err != nil {
		t.Fatal(err)
	}
	code, _, err := r.Node.IssueCode(p, device, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// sessionFor opens device with a code at r through c and returns the
// session cookie the relay set.
func sessionFor(t *testing.T, r *Relay, c *http.Client, token, device string) string {
	t.Helper()
	resp, err := c.Get(r.URL + "/client/" + device + "/seen?code=" + url.QueryEscape(codeFor(t, r, token, device)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, ck := range resp.Cookies() {
		if ck.Name == access.SessionCookie {
			return ck.Value
		}
	}
	t.Fatalf("no session cookie from %s: %s", r.URL, resp.Status)
	return ""
}
