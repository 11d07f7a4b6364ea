package fleettest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/limit"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// issueCode asks r's operator API for a code for device under path, as the
// holder of token.
func issueCode(t *testing.T, r *Relay, token, device, path string) control.CreatedCode {
	t.Helper()
	c := &control.Client{BaseURL: r.AdminURL, Token: token}
	code, err := c.CreateCode(context.Background(), control.CodeRequest{Device: device, Path: path})
	if err != nil {
		t.Fatalf("issue a code for %s%s: %v", device, path, err)
	}
	return code
}

// get sends a GET to url with the given header pairs and returns the
// status, the body and the response.
func get(t *testing.T, url string, hdr ...string) (int, string, *http.Response) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

func TestAccessCodes(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		relays, _, user := fleetSetup(t, proto)
		entry, other, holder := relays[0], relays[1], relays[2]

		// A code issued on one relay opens the device through another; it
		// never reaches the device, nor do the device's own "code"
		// parameters get taken.
		c := issueCode(t, holder, user, "dev", "/")
		if !strings.HasPrefix(c.URLPath, "/client/dev/?code=") || c.ExpiresAt.After(time.Now().Add(access.MaxCodeTTL+time.Second)) {
			t.Fatalf("issued %+v", c)
		}
		status, body, resp := get(t, entry.URL+"/client/dev/echo/page?code=oauth-123&"+strings.TrimPrefix(c.URLPath, "/client/dev/?")+"&x=1")
		if status != http.StatusOK {
			t.Fatalf("first use: %d %s", status, body)
		}
		var e echoReply
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatal(err)
		}
		if e.Query != "code=oauth-123&x=1" || strings.Contains(fmt.Sprint(e.Header), c.Code) || e.Header.Get(access.TicketHeader) != "" {
			t.Errorf("the device saw query %q, header %v", e.Query, e.Header)
		}
		var session *http.Cookie
		for _, ck := range resp.Cookies() {
			if ck.Name == access.SessionCookie {
				session = ck
			}
		}
		if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || session.Path != "/client/dev/" {
			t.Fatalf("session cookie %+v", session)
		}

		// Single use, wherever the second attempt enters.
		for _, r := range []*Relay{entry, other, holder} {
			status, body, _ := get(t, r.URL+c.URLPath)
			if status != http.StatusUnauthorized || !strings.Contains(body, "already used") {
				t.Errorf("reuse via %s: %d %s", r.URL, status, body)
			}
		}

		// The session opens the page's other requests, on any relay, and
		// never reaches the device; it is for its device only.
		cookie := access.SessionCookie + "=" + session.Value
		status, body, _ = get(t, other.URL+"/client/dev/echo/asset.js", "Cookie", "theme=dark; "+cookie)
		if status != http.StatusOK || strings.Contains(body, session.Value) || !strings.Contains(body, "theme=dark") {
			t.Errorf("session via another relay: %d %s", status, body)
		}
		if status, body, _ := get(t, entry.URL+"/client/other/x", "Cookie", cookie); status != http.StatusUnauthorized {
			t.Errorf("session for another device: %d %s", status, body)
		}

		// Websockets: a code works; the cookie only from the same origin.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ws := "ws" + strings.TrimPrefix(entry.URL, "http")
		wc := issueCode(t, entry, user, "dev", "/ws")
		conn, _, err := websocket.Dial(ctx, ws+wc.URLPath, nil)
		if err != nil {
			t.Fatalf("websocket with a code: %v", err)
		}
		if err := conn.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if _, got, err := conn.Read(ctx); err != nil || string(got) != "hi" {
			t.Fatalf("echo %q, %v", got, err)
		}
		conn.Close(websocket.StatusNormalClosure, "")
		_, resp, err = websocket.Dial(ctx, ws+"/client/dev/ws", &websocket.DialOptions{HTTPHeader: http.Header{
			"Cookie": {cookie}, "Origin": {"https://evil.example"},
		}})
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("cross-site websocket with the cookie: %v, %v", resp, err)
		}
		conn, _, err = websocket.Dial(ctx, ws+"/client/dev/ws", &websocket.DialOptions{HTTPHeader: http.Header{
			"Cookie": {cookie}, "Origin": {entry.URL},
		}})
		if err != nil {
			t.Fatalf("same-origin websocket with the cookie: %v", err)
		}
		conn.Close(websocket.StatusNormalClosure, "")
	})
}

func TestAccessCodeRefusals(t *testing.T) {
	relays, _, user := fleetSetup(t, "native")
	entry := relays[0]
	ring := entry.Node.Secrets()
	now := time.Now()
	mint := func(g access.Grant, key []byte) string { return access.Encode(key, access.CodePrefix, g) }
	good := access.Grant{Device: "dev", Scope: "/", TokenID: "none", Issued: now, Expires: now.Add(30 * time.Second), Nonce: access.NewNonce()}
	userID := tokenID(t, entry, user)
	withTok := func(g access.Grant) access.Grant { g.TokenID = userID; g.Nonce = access.NewNonce(); return g }
	expired := withTok(good)
	expired.Issued, expired.Expires = now.Add(-2*time.Minute), now.Add(-time.Minute)
	long := withTok(good)
	long.Expires = now.Add(10 * time.Minute)
	scoped := issueCode(t, entry, user, "dev", "/ui/")
	// A payload of one code under the signature of another.
	payload, _, _ := strings.Cut(mint(withTok(good), ring.SigningKey(secret.PurposeCode)), ".")
	_, sig, _ := strings.Cut(mint(withTok(good), ring.SigningKey(secret.PurposeCode)), ".")
	forged := payload + "." + sig

	cases := []struct {
		name   string
		target string
		status int
		words  string
	}{
		{"forged signature", "/client/dev/?code=" + forged, 401, "not signed by this fleet"},
		{"signed with another secret", "/client/dev/?code=" + mint(withTok(good), secret.New()), 401, "not signed by this fleet"},
		{"signed for peers, not codes", "/client/dev/?code=" + mint(withTok(good), ring.SigningKey(secret.PurposePeer)), 401, "not signed by this fleet"},
		{"expired", "/client/dev/?code=" + mint(expired, ring.SigningKey(secret.PurposeCode)), 401, "expired"},
		{"longer than a minute", "/client/dev/?code=" + mint(long, ring.SigningKey(secret.PurposeCode)), 401, "malformed"},
		{"unknown token", "/client/dev/?code=" + mint(good, ring.SigningKey(secret.PurposeCode)), 401, "revoked"},
		{"another device", "/client/other/?code=" + mint(withTok(good), ring.SigningKey(secret.PurposeCode)), 403, `"dev"`},
		{"outside its path", "/client/dev/api?" + strings.SplitN(scoped.URLPath, "?", 2)[1], 403, `"/ui/"`},
		{"truncated", "/client/dev/?code=" + access.CodePrefix + "abc", 401, "malformed"},
		{"session presented as a code", "/client/dev/?code=" + access.CodePrefix + strings.TrimPrefix(access.Encode(ring.SigningKey(secret.PurposeCode), access.SessionPrefix, withTok(good)), access.SessionPrefix), 401, "not signed"},
		{"oversized", "/client/dev/?code=" + access.CodePrefix + strings.Repeat("A", 4000), 401, "malformed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body, _ := get(t, entry.URL+c.target)
			if status != c.status || !strings.Contains(body, c.words) {
				t.Errorf("%d %q, want %d with %q", status, body, c.status, c.words)
			}
			if strings.Contains(body, access.CodePrefix) {
				t.Errorf("the answer echoes the code: %q", body)
			}
		})
	}

	// An agent token cannot issue codes; a user token only for its devices.
	agentTok := entry.Token(t, auth.KindAgent, "a", "dev")
	for _, x := range []struct {
		token, device string
		status        int
	}{{agentTok, "dev", 403}, {user, "other", 403}, {"", "dev", 401}} {
		c := &control.Client{BaseURL: entry.AdminURL, Token: x.token}
		_, err := c.CreateCode(context.Background(), control.CodeRequest{Device: x.device})
		var se *control.APIError
		if !errors.As(err, &se) || se.Status != x.status {
			t.Errorf("code for %s with token %.4s…: %v, want %d", x.device, x.token, err, x.status)
		}
	}
}

// tokenID returns the id of the token secret on r.
func tokenID(t *testing.T, r *Relay, secret string) string {
	t.Helper()
	p, err := r.Node.Tokens().Authenticate(secret)
	if err != nil {
		t.Fatal(err)
	}
	return p.TokenID
}

// TestRevocationCutsSessionsAcrossTheFleet revokes tokens on one relay and
// checks that what they let in on another is cut: a user's websocket and
// streamed download, a session a code opened, and an agent's tunnel.
func TestRevocationCutsSessionsAcrossTheFleet(t *testing.T) {
	relays, _, _ := fleetSetup(t, "native")
	entry, admin := relays[0], relays[2]
	user := FleetToken(t, relays, auth.KindUser, "mallory", "dev")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(entry.URL, "http")+"/client/dev/ws", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + user}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := conn.Read(ctx); err != nil {
		t.Fatal(err)
	}
	stream := do(t, http.MethodGet, entry.URL+"/client/dev/stream-forever", user, nil)
	defer stream.Body.Close()
	if stream.StatusCode != http.StatusOK {
		t.Fatalf("stream: %s", stream.Status)
	}
	Eventually(t, 5*time.Second, func() error {
		if n := entry.Node.ActiveSessions(tokenID(t, entry, user)); n != 2 {
			return fmt.Errorf("%d sessions filed under the token, want 2", n)
		}
		return nil
	})

	c := &control.Client{BaseURL: admin.AdminURL, Token: admin.AdminToken}
	revokedAt := time.Now()
	if err := c.RevokeToken(ctx, tokenID(t, admin, user)); err != nil {
		t.Fatal(err)
	}
	wsDone := make(chan error, 1)
	go func() {
		_, _, err := conn.Read(ctx)
		wsDone <- err
	}()
	_, streamErr := io.Copy(io.Discard, stream.Body)
	if streamErr == nil {
		t.Error("the stream ended cleanly; want it cut")
	}
	if err := <-wsDone; err == nil || ctx.Err() != nil {
		t.Errorf("websocket read after revocation: %v (test context %v)", err, ctx.Err())
	}
	t.Logf("revocation on %s cut the sessions on %s after %s", admin.URL, entry.URL, time.Since(revokedAt).Round(10*time.Microsecond))
	if status, body, _ := get(t, entry.URL+"/client/dev/echo/x", "Authorization", "Bearer "+user); status != http.StatusUnauthorized {
		t.Errorf("revoked token: %d %s", status, body)
	}

	// An agent token revoked elsewhere closes the agent's tunnel here, and
	// the agent cannot come back with it.
	b := newBackend(t, "b2")
	holder, _ := HolderFor(t, relays, "dev2")
	agentTok := FleetToken(t, relays, auth.KindAgent, "dev2 agent", "dev2")
	StartAgent(t, holder, "dev2", b.URL, agentTok)
	waitAnywhere(t, relays, "dev2", true)
	if err := c.RevokeToken(ctx, tokenID(t, admin, agentTok)); err != nil {
		t.Fatal(err)
	}
	waitAnywhere(t, relays, "dev2", false)
	// A long-poll agent's revoked token fails the requests it is answering.
	lpHolder, _ := HolderFor(t, relays, "dev3")
	lpTok := FleetToken(t, relays, auth.KindAgent, "dev3 agent", "dev3")
	StartAgent(t, lpHolder, "dev3", b.URL, lpTok, protocol(agent.ProtocolLongPoll))
	waitAnywhere(t, relays, "dev3", true) // its polls meet where the fleet places the device
	user3 := FleetToken(t, relays, auth.KindUser, "carol", "dev3")
	stream3 := do(t, http.MethodGet, entry.URL+"/client/dev3/stream-forever", user3, nil)
	defer stream3.Body.Close()
	if _, err := stream3.Body.Read(make([]byte, 1)); err != nil {
		t.Fatalf("long-poll stream: %s %v", stream3.Status, err)
	}
	if err := c.RevokeToken(ctx, tokenID(t, admin, lpTok)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, stream3.Body); err == nil {
		t.Error("the long-poll agent's stream ended cleanly after its token was revoked; want it cut")
	}

	other := FleetToken(t, relays, auth.KindUser, "alice", "dev2")
	if status, body, _ := get(t, entry.URL+"/client/dev2/echo/x", "Authorization", "Bearer "+other); status != http.StatusServiceUnavailable {
		t.Errorf("device of a revoked agent: %d %s", status, body)
	}
}

// waitAnywhere waits until some relay has an agent for device (connected)
// or none has (not connected). The fleet may place a device elsewhere than
// the relay its agent was given.
func waitAnywhere(t *testing.T, relays []*Relay, device string, connected bool) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		found := slices.ContainsFunc(relays, func(r *Relay) bool { return slices.Contains(r.Node.Devices(), device) })
		if found != connected {
			return fmt.Errorf("an agent for %s connected somewhere: %v, want %v", device, found, connected)
		}
		return nil
	})
}

// TestRevocationEndsCodeSessions checks that a session a code opened ends
// with the token the code was issued to.
func TestRevocationEndsCodeSessions(t *testing.T) {
	relays, _, _ := fleetSetup(t, "longpoll")
	user := FleetToken(t, relays, auth.KindUser, "bob", "dev")
	c := issueCode(t, relays[0], user, "dev", "/")
	status, body, resp := get(t, relays[1].URL+"/client/dev/echo/z?code="+c.Code)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	var cookie string
	for _, ck := range resp.Cookies() {
		cookie = ck.Name + "=" + ck.Value
	}
	admin := &control.Client{BaseURL: relays[2].AdminURL, Token: relays[2].AdminToken}
	if err := admin.RevokeToken(context.Background(), tokenID(t, relays[2], user)); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 5*time.Second, func() error {
		status, body, _ := get(t, relays[1].URL+"/client/dev/echo/y", "Cookie", cookie)
		if status != http.StatusUnauthorized || !bytes.Contains([]byte(body), []byte("revoked")) {
			return fmt.Errorf("session after revocation: %d %s", status, body)
		}
		return nil
	})
}

// TestAuthBackoff checks the back-off of an address that keeps presenting
// invalid credentials: refused with 429 and Retry-After for every kind of
// credential, until its window passes; missing credentials and valid ones
// for another device do not count, and the admin listener keeps a count of
// its own.
func TestAuthBackoff(t *testing.T) {
	r := StartRelay(t, func(c *node.Config) { c.AuthBackoff = limit.Config{FreeFailures: 3} })
	b := newBackend(t, "b1")
	StartAgent(t, r, "dev", b.URL, r.Token(t, auth.KindAgent, "dev agent", "dev"))
	r.WaitDevice(t, "dev")
	user := r.Token(t, auth.KindUser, "alice", "dev")
	other := r.Token(t, auth.KindUser, "bob", "other")

	// Not failures: no credential, and a valid one for another device.
	for range 5 {
		if status, _, _ := get(t, r.URL+"/client/dev/echo/x"); status != http.StatusUnauthorized {
			t.Fatalf("no token: %d", status)
		}
		if status, _, _ := get(t, r.URL+"/client/dev/echo/x", "Authorization", "Bearer "+other); status != http.StatusForbidden {
			t.Fatalf("another device's token: %d", status)
		}
	}
	if status, body, _ := get(t, r.URL+"/client/dev/echo/x", "Authorization", "Bearer "+user); status != http.StatusOK {
		t.Fatalf("good token before any failure: %d %s", status, body)
	}

	bad := []func() (int, string, *http.Response){
		func() (int, string, *http.Response) {
			return get(t, r.URL+"/client/dev/echo/x", "Authorization", "Bearer sbu_00000000_"+strings.Repeat("A", 43))
		},
		func() (int, string, *http.Response) {
			return get(t, r.URL+"/client/dev/echo/x?code="+access.CodePrefix+"forged.AAAA")
		},
		func() (int, string, *http.Response) {
			return get(t, r.URL+"/server/request?server=dev", "Authorization", "Bearer sba_00000000_"+strings.Repeat("A", 43))
		},
	}
	// Three failures are free; the fourth starts the refusal.
	for i, f := range append(bad, bad[0]) {
		if status, body, _ := f(); status != http.StatusUnauthorized {
			t.Fatalf("bad credential %d: %d %s", i, status, body)
		}
	}
	// The next attempt from this address is refused, whatever it carries
	// and whichever listener it reaches.
	for _, c := range []struct {
		name string
		send func() (int, string, *http.Response)
	}{
		{"a bad token", bad[0]},
		{"a good token", func() (int, string, *http.Response) {
			return get(t, r.URL+"/client/dev/echo/x", "Authorization", "Bearer "+user)
		}},
	} {
		status, body, resp := c.send()
		if status != http.StatusTooManyRequests || !strings.Contains(body, "too many failed") || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s while refused: %d %q, Retry-After %q", c.name, status, body, resp.Header.Get("Retry-After"))
		}
	}
	// The admin listener keeps its own count: the operator, behind the
	// same address, is not refused for the users' failures.
	if status, body, _ := get(t, r.AdminURL+"/api/v1/tokens", "Authorization", "Bearer "+r.AdminToken); status != http.StatusOK {
		t.Errorf("the admin token while the public listener refuses the address: %d %s", status, body)
	}
	if status, body, _ := get(t, r.AdminURL+"/api/v1/tokens", "Authorization", "Bearer sbx_00000000_"+strings.Repeat("A", 43)); status != http.StatusUnauthorized {
		t.Errorf("a bad admin token while the public listener refuses the address: %d %s", status, body)
	}
	// Once the window passes, a good token works again.
	Eventually(t, 10*time.Second, func() error {
		if status, body, _ := get(t, r.URL+"/client/dev/echo/x", "Authorization", "Bearer "+user); status != http.StatusOK {
			return fmt.Errorf("good token: %d %s", status, body)
		}
		return nil
	})
}

// TestAccessCodesStayOutOfLogs uses, reuses and forges codes on a relay
// logging at debug level, and finds no trace of them in its log or its
// metrics.
func TestAccessCodesStayOutOfLogs(t *testing.T) {
	logs := &testkit.Buffer{}
	r := StartRelay(t, func(c *node.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	b := newBackend(t, "b1")
	StartAgent(t, r, "dev", b.URL, r.Token(t, auth.KindAgent, "dev agent", "dev"))
	r.WaitDevice(t, "dev")
	user := r.Token(t, auth.KindUser, "alice", "dev")
	var codes []string
	for _, path := range []string{"/echo/ok", "/nowhere", "/ws"} {
		c := issueCode(t, r, user, "dev", path)
		codes = append(codes, c.Code)
		get(t, r.URL+c.URLPath)
		get(t, r.URL+c.URLPath) // reused
	}
	forged := codes[0][:len(codes[0])-4] + "AAAA"
	codes = append(codes, forged)
	get(t, r.URL+"/client/dev/echo/x?code="+forged)
	get(t, r.URL+"/client/other/x?code="+codes[1])
	_, metrics, _ := get(t, r.AdminURL+"/metrics")
	for _, c := range codes {
		_, sig, _ := strings.Cut(c, ".")
		for where, text := range map[string]string{"log": logs.String(), "metrics": metrics} {
			if strings.Contains(text, sig) || strings.Contains(text, c[:40]) {
				t.Errorf("the %s holds a code: %.60s…", where, c)
			}
		}
	}
	if !strings.Contains(logs.String(), "level=DEBUG") {
		t.Error("the relay logged nothing at debug level: the test looked at nothing")
	}
}
