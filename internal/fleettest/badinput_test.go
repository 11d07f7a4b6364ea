package fleettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// Limits of the relays in TestBadInput.
const (
	badMaxBody       = 1024
	badMaxChunk      = 4096
	badMaxHeader     = 4096 // net/http allows 4096 bytes more before it answers 431
	badHeaderTimeout = 300 * time.Millisecond
	badInactive      = 500 * time.Millisecond
)

// panicWatch is a log handler that remembers every record mentioning a
// panic (net/http logs recovered handler panics through the node's logger).
type panicWatch struct {
	mu     sync.Mutex // guards panics
	panics []string
}

func (p *panicWatch) Enabled(context.Context, slog.Level) bool { return true }
func (p *panicWatch) WithAttrs([]slog.Attr) slog.Handler       { return p }
func (p *panicWatch) WithGroup(string) slog.Handler            { return p }
func (p *panicWatch) Handle(_ context.Context, r slog.Record) error {
	text := r.Message
	r.Attrs(func(a slog.Attr) bool {
		text += " " + a.String()
		return true
	})
	if strings.Contains(strings.ToLower(text), "panic") {
		p.mu.Lock()
		p.panics = append(p.panics, text)
		p.mu.Unlock()
	}
	return nil
}

func (p *panicWatch) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	got := p.panics
	p.panics = nil
	return got
}

// badEnv is what TestBadInput runs against: a relay with small limits and
// a relay with a short inactivity timeout, each with a real long-poll agent
// for "dev", and tokens of every kind.
type badEnv struct {
	main, slow *Relay
	watch      *panicWatch
	client     *http.Client

	badTokens            // of main
	slowTokens badTokens // of slow
}

// badTokens are credentials on one relay.
type badTokens struct {
	user        string // a user token for every device
	userOther   string // a user token for "other" only
	agentAsUser string // an agent token for "dev", presented by a user
	agentDev    string // the agent token for "dev"
	agentOther  string // an agent token for "other"
	agentFake   string // the agent token for "fake" (hand-driven agent) and "idle"
}

func newBadTokens(t *testing.T, r *Relay) badTokens {
	return badTokens{
		user:        r.Token(t, auth.KindUser, "alice"),
		userOther:   r.Token(t, auth.KindUser, "bob", "other"),
		agentAsUser: r.Token(t, auth.KindAgent, "dev agent 2", "dev"),
		agentDev:    r.Token(t, auth.KindAgent, "dev agent 3", "dev"),
		agentOther:  r.Token(t, auth.KindAgent, "other agent", "other"),
		agentFake:   r.Token(t, auth.KindAgent, "fake agent", "fake", "idle"),
	}
}

// tokens returns the credentials on r.
func (e *badEnv) tokens(r *Relay) badTokens {
	if r == e.slow {
		return e.slowTokens
	}
	return e.badTokens
}

func newBadEnv(t *testing.T) *badEnv {
	t.Helper()
	e := &badEnv{watch: &panicWatch{}}
	tr := &http.Transport{}
	e.client = &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)

	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "ok %s\n", r.URL.Path)
	}))
	t.Cleanup(backend.Close)

	logger := slog.New(e.watch)
	e.main = StartRelay(t, func(c *node.Config) {
		c.Broker.MaxBodyBytes = badMaxBody
		c.Broker.MaxPendingPerDevice = 1
		c.Broker.PollWait = 200 * time.Millisecond // idle polls end quickly: the device "idle" has none waiting
		c.MaxChunkBytes = badMaxChunk
		c.MaxHeaderBytes = badMaxHeader
		c.ReadHeaderTimeout = badHeaderTimeout
		c.Logger = logger
	})
	e.slow = StartRelay(t, func(c *node.Config) {
		c.Broker.InactiveRequestTimeout = badInactive
		c.Broker.PickupTimeout = badInactive
		c.Logger = logger
	})
	longPoll := func(c *agent.Config) {
		c.Protocol = agent.ProtocolLongPoll
		c.MaxChunkSize = 1024
	}
	for _, r := range []*Relay{e.main, e.slow} {
		StartAgent(t, r, "dev", backend.URL, r.Token(t, auth.KindAgent, "dev agent", "dev"), longPoll)
		r.WaitDevice(t, "dev")
	}
	e.badTokens = newBadTokens(t, e.main)
	e.slowTokens = newBadTokens(t, e.slow)
	return e
}

// badResult is what a relay answered.
type badResult struct {
	status int
	header http.Header
	body   string
	closed bool // the relay closed the connection without an answer
}

// do sends a request through the env's client.
func (e *badEnv) do(t *testing.T, method, url string, body io.Reader, hdr ...string) badResult {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return e.send(t, req)
}

func (e *badEnv) send(t *testing.T, req *http.Request) badResult {
	t.Helper()
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL, err)
	}
	return badResult{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// raw writes text on a new connection to r and reads one response.
func raw(t *testing.T, r *Relay, text string) badResult {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, text); err != nil {
		t.Fatalf("write request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return badResult{closed: true}
		}
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return badResult{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// rawGet is a raw GET of target with extra header lines.
func rawGet(t *testing.T, r *Relay, target string, headers ...string) badResult {
	t.Helper()
	text := "GET " + target + " HTTP/1.1\r\nHost: relay.example\r\nConnection: close\r\n"
	for _, h := range headers {
		text += h + "\r\n"
	}
	return raw(t, r, text+"\r\n")
}

// fakeAgent is a long-poll agent driven by hand: it takes one request for
// its device, then does what the test says. Its goroutine ends by itself.
type fakeAgent struct {
	took   chan *wire.Request
	posted chan int // the relay's status for the agent's post
	done   chan struct{}
}

// startFakeAgent polls r for device until a request arrives, then posts
// answer (unless it is nil) as the response's first chunk.
func (e *badEnv) startFakeAgent(t *testing.T, r *Relay, device string, answer *wire.Response) *fakeAgent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	fa := &fakeAgent{took: make(chan *wire.Request, 1), posted: make(chan int, 1), done: make(chan struct{})}
	go func() {
		defer close(fa.done)
		defer cancel()
		token := e.tokens(r).agentFake
		msg, err := fakePoll(ctx, e.client, r, device, token)
		if err != nil {
			return
		}
		fa.took <- msg
		if answer == nil {
			return
		}
		answer.ID = msg.ID
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.URL+"/server/response", strings.NewReader(string(answer.Marshal())))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", wire.ContentTypeResponse)
		resp, err := e.client.Do(req)
		if err != nil {
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fa.posted <- resp.StatusCode
	}()
	t.Cleanup(func() {
		cancel()
		<-fa.done
	})
	return fa
}

// fakePoll polls until a request for device arrives.
func fakePoll(ctx context.Context, client *http.Client, r *Relay, device, token string) (*wire.Request, error) {
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/server/request?server="+device, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return nil, err
		case resp.StatusCode == http.StatusRequestTimeout:
			continue
		case resp.StatusCode != http.StatusOK:
			return nil, fmt.Errorf("poll: %s: %s", resp.Status, body)
		}
		return wire.UnmarshalRequest(body, 1<<20)
	}
	return nil, ctx.Err()
}

// pending reads the relay's count of requests waiting for an agent.
func (e *badEnv) pending(t *testing.T, r *Relay) (float64, error) {
	res := e.do(t, http.MethodGet, r.AdminURL+"/metrics", nil)
	for line := range strings.Lines(res.body) {
		if v, ok := strings.CutPrefix(line, "switchboard_broker_pending_requests "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, errors.New("no switchboard_broker_pending_requests in /metrics")
}

// misbehave sends a user request for "fake" on r while a fake agent
// answers it with first (nil: never answers), and returns the user's result.
func (e *badEnv) misbehave(t *testing.T, r *Relay, first *wire.Response) badResult {
	t.Helper()
	fa := e.startFakeAgent(t, r, "fake", first)
	r.WaitDevice(t, "fake")
	res := e.do(t, http.MethodGet, r.URL+"/client/fake/echo/x", nil, "X-Switchboard-Token", e.tokens(r).user)
	if first != nil {
		select {
		case status := <-fa.posted:
			if status != http.StatusOK {
				t.Errorf("the relay answered the agent's chunk %d, want 200 (it took it)", status)
			}
		case <-time.After(10 * time.Second):
			t.Error("the fake agent's post got no answer")
		}
	}
	return res
}

// queueFull fills the one pending slot of "idle", whose agent polled once
// and has no poll waiting, and sends one more request.
func (e *badEnv) queueFull(t *testing.T) badResult {
	t.Helper()
	r := e.main
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/server/request?server=idle", nil)
	req.Header.Set("Authorization", "Bearer "+e.agentFake)
	if res := e.send(t, req); res.status != http.StatusRequestTimeout {
		t.Fatalf("poll for idle: %d %q, want 408", res.status, res.body)
	}
	first := make(chan struct{})
	go func() {
		defer close(first)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/client/idle/", nil)
		req.Header.Set("X-Switchboard-Token", e.user)
		if resp, err := e.client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	defer func() {
		cancel()
		<-first
	}()
	Eventually(t, 10*time.Second, func() error {
		n, err := e.pending(t, r)
		if err == nil && n != 1 {
			err = fmt.Errorf("%v requests pending, want the first one", n)
		}
		return err
	})
	return e.do(t, http.MethodGet, r.URL+"/client/idle/", nil, "X-Switchboard-Token", e.user)
}

// slowloris sends half a header block and waits for the relay to hang up.
func slowloris(t *testing.T, r *Relay) badResult {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /client/dev/echo/ HTTP/1.1\r\nHost: relay.example\r\nX-Slow: ")
	start := time.Now()
	conn.SetReadDeadline(start.Add(badHeaderTimeout + 5*time.Second))
	n, err := conn.Read(make([]byte, 1024))
	if n > 0 || (!errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err)) {
		t.Fatalf("after half a header block the relay sent %d bytes, err %v; want the connection closed", n, err)
	}
	if took := time.Since(start); took < badHeaderTimeout-50*time.Millisecond {
		t.Fatalf("the connection closed after %v, before the header timeout %v", took, badHeaderTimeout)
	}
	return badResult{closed: true}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// hideLength hides a reader's length so that the body is sent chunked.
type hideLength struct{ io.Reader }

// checkReadable checks that body is a message a person can read that
// mentions each of words.
func checkReadable(t *testing.T, res badResult, words []string) {
	t.Helper()
	if ct := res.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want text/plain", ct)
	}
	msg := strings.TrimSpace(res.body)
	if msg == "" || !utf8.ValidString(msg) {
		t.Errorf("body %q is no readable message", res.body)
	}
	for _, r := range msg {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			t.Errorf("body %q has control character %U", res.body, r)
			break
		}
	}
	for _, w := range words {
		if !strings.Contains(strings.ToLower(msg), strings.ToLower(w)) {
			t.Errorf("body %q does not mention %q", msg, w)
		}
	}
}

// TestBadInput sends what careless or hostile users and agents send, and
// checks that each gets the exact status with a message that says what is
// wrong, that nothing panics, and that the relay serves a good request
// right after.
func TestBadInput(t *testing.T) {
	e := newBadEnv(t)
	m, s := e.main, e.slow
	long := func(n int) string { return strings.Repeat("d", n) }
	unknownID := "dev:" + strings.Repeat("0", 32)
	chunk := func(msg *wire.Response) io.Reader { return strings.NewReader(string(msg.Marshal())) }
	userHdr := func(token string) []string { return []string{"X-Switchboard-Token", token} }
	agentHdr := func(token string) []string { return []string{"Authorization", "Bearer " + token} }

	tests := []struct {
		name       string
		relay      *Relay // where it is sent; nil means main
		send       func(t *testing.T) badResult
		status     int      // 0: the relay closes the connection without an answer
		words      []string // the body mentions each (case-insensitive)
		retryAfter bool
		within     time.Duration // the answer comes within; 0 means 10 s
	}{
		// Addressing.
		{name: "/client/ without a name", status: 400, words: []string{"no device named"},
			send: func(t *testing.T) badResult { return e.do(t, "GET", m.URL+"/client/", nil, userHdr(e.user)...) }},
		{name: "/client alone", status: 400, words: []string{"no device named"},
			send: func(t *testing.T) badResult { return e.do(t, "GET", m.URL+"/client", nil, userHdr(e.user)...) }},
		{name: "neither prefix nor X-Server-Name", status: 400, words: []string{"X-Server-Name", "/client/"},
			send: func(t *testing.T) badResult { return e.do(t, "GET", m.URL+"/echo/x", nil, userHdr(e.user)...) }},
		{name: "bad character in the device", status: 400, words: []string{`"de$v"`, "letters, digits"},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/client/de$v/echo/") }},
		{name: "escaped space in the device", status: 400, words: []string{`"de v"`},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/client/de%20v/echo/") }},
		{name: "%2F in the device", status: 400, words: []string{`"a/b"`},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/client/a%2Fb/echo/") }},
		{name: "64-character device", status: 400, words: []string{"1 to 63"},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/client/"+long(64)+"/echo/") }},
		{name: "device starting with a dot", status: 400, words: []string{"must not start with '.'"},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/client/.dev/echo/") }},
		{name: "device ..", status: 400, words: []string{`".."`},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/client/../echo/") }},
		{name: "invalid X-Server-Name", status: 400, words: []string{`"bad name!"`},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/echo/", nil, "X-Server-Name", "bad name!", "X-Switchboard-Token", e.user)
			}},
		{name: "64-character X-Server-Name", status: 400, words: []string{"1 to 63"},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/echo/", nil, "X-Server-Name", long(64), "X-Switchboard-Token", e.user)
			}},
		{name: ".. segment", status: 400, words: []string{"'..'"},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/client/dev/echo/../secret") }},
		{name: "%2e%2e segment", status: 400, words: []string{"'..'"},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/client/dev/echo/%2e%2e/secret") }},
		{name: "%2E%2E segment in header mode", status: 400, words: []string{"'..'"},
			send: func(t *testing.T) badResult { return rawGet(t, m, "/echo/%2E%2E/secret", "X-Server-Name: dev") }},
		{name: "asterisk target in header mode", status: 400, words: []string{"path"},
			send: func(t *testing.T) badResult {
				return rawGet(t, m, "*", "X-Server-Name: dev", "X-Switchboard-Token: "+e.user)
			}},
		{name: "opaque target in header mode", status: 400, words: []string{"path"},
			send: func(t *testing.T) badResult {
				return rawGet(t, m, "http:..%2f..%2fsecret", "X-Server-Name: dev", "X-Switchboard-Token: "+e.user)
			}},

		// Availability.
		{name: "unknown device", status: 503, words: []string{`"ghost"`, "no agent"}, retryAfter: true, within: time.Second,
			send: func(t *testing.T) badResult { return e.do(t, "GET", m.URL+"/client/ghost/", nil, userHdr(e.user)...) }},
		{name: "pending queue full", status: 503, words: []string{`"idle"`, "waiting"}, retryAfter: true,
			send: func(t *testing.T) badResult { return e.queueFull(t) }},

		// Limits.
		{name: "body over the limit", status: 413, words: []string{strconv.Itoa(badMaxBody)},
			send: func(t *testing.T) badResult {
				return e.do(t, "POST", m.URL+"/client/dev/echo/", strings.NewReader(long(2*badMaxBody)), userHdr(e.user)...)
			}},
		{name: "chunked body over the limit", status: 413, words: []string{strconv.Itoa(badMaxBody)},
			send: func(t *testing.T) badResult {
				return e.do(t, "POST", m.URL+"/client/dev/echo/", hideLength{strings.NewReader(long(badMaxBody + 1))}, userHdr(e.user)...)
			}},
		{name: "header block over the limit", status: 431, words: []string{"header"},
			send: func(t *testing.T) badResult {
				return rawGet(t, m, "/client/dev/echo/", "X-Big: "+long(4*badMaxHeader))
			}},
		{name: "half a header block", status: 0, within: badHeaderTimeout + 5*time.Second,
			send: func(t *testing.T) badResult { return slowloris(t, m) }},

		// Agent endpoints.
		{name: "poll without server", status: 400, words: []string{"server"},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/server/request", nil, agentHdr(e.agentDev)...)
			}},
		{name: "poll without token", status: 401, words: []string{"agent token"},
			send: func(t *testing.T) badResult { return e.do(t, "GET", m.URL+"/server/request?server=dev", nil) }},
		{name: "poll with another device's token", status: 403, words: []string{`"dev"`},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/server/request?server=dev", nil, agentHdr(e.agentOther)...)
			}},
		{name: "poll with a user token", status: 403, words: []string{"agent token"},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/server/request?server=dev", nil, agentHdr(e.user)...)
			}},
		{name: "response of garbage", status: 400, words: []string{"decode"},
			send: func(t *testing.T) badResult {
				return e.do(t, "POST", m.URL+"/server/response", strings.NewReader("\xff\xff\xff garbage"), agentHdr(e.agentDev)...)
			}},
		{name: "response without id", status: 400, words: []string{"id"},
			send: func(t *testing.T) badResult {
				return e.do(t, "POST", m.URL+"/server/response", chunk(&wire.Response{HasStatus: true, StatusCode: 200, EOF: true}), agentHdr(e.agentDev)...)
			}},
		{name: "response for an unknown id", status: 400, words: []string{"unknown"},
			send: func(t *testing.T) badResult {
				return e.do(t, "POST", m.URL+"/server/response", chunk(&wire.Response{ID: unknownID, HasStatus: true, StatusCode: 200}), agentHdr(e.agentDev)...)
			}},
		{name: "response over the chunk limit", status: 413, words: []string{strconv.Itoa(badMaxChunk)},
			send: func(t *testing.T) badResult {
				big := &wire.Response{ID: unknownID, Body: []byte(long(badMaxChunk))}
				return e.do(t, "POST", m.URL+"/server/response", chunk(big), agentHdr(e.agentDev)...)
			}},
		{name: "requeststream without id", status: 400, words: []string{"id"},
			send: func(t *testing.T) badResult {
				return e.do(t, "POST", m.URL+"/server/requeststream", nil, agentHdr(e.agentDev)...)
			}},
		{name: "requeststream with a malformed id", status: 400, words: []string{"id"},
			send: func(t *testing.T) badResult {
				return e.do(t, "POST", m.URL+"/server/requeststream?id=nocolon", nil, agentHdr(e.agentDev)...)
			}},
		{name: "requeststream for an unknown id", status: 410, words: []string{"unknown"},
			send: func(t *testing.T) badResult {
				return e.do(t, "POST", m.URL+"/server/requeststream?id="+unknownID, nil, agentHdr(e.agentDev)...)
			}},
		{name: "GET /server/response", status: 405, words: []string{"POST"},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/server/response", nil, agentHdr(e.agentDev)...)
			}},
		{name: "/server/nope", status: 404, words: []string{"/server/nope"},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/server/nope", nil, agentHdr(e.agentDev)...)
			}},

		// Users.
		{name: "user without a token", status: 401, words: []string{"user token"},
			send: func(t *testing.T) badResult { return e.do(t, "GET", m.URL+"/client/dev/echo/", nil) }},
		{name: "user with a forged token", status: 401, words: []string{"not valid"},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/client/dev/echo/", nil, userHdr("sbu_0123abcd_"+strings.Repeat("A", 43))...)
			}},
		{name: "user token for another device", status: 403, words: []string{`"dev"`},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/client/dev/echo/", nil, userHdr(e.userOther)...)
			}},
		{name: "agent token used by a user", status: 403, words: []string{"agent token"},
			send: func(t *testing.T) badResult {
				return e.do(t, "GET", m.URL+"/client/dev/echo/", nil, "Authorization", "Bearer "+e.agentAsUser)
			}},

		// Agents that break the protocol.
		{name: "first chunk without status_code", status: 502, words: []string{`"fake"`, "status code"},
			send: func(t *testing.T) badResult {
				return e.misbehave(t, m, &wire.Response{Body: []byte("no head"), EOF: true})
			}},
		{name: "status code 42", status: 502, words: []string{`"fake"`, "42"},
			send: func(t *testing.T) badResult {
				return e.misbehave(t, m, &wire.Response{HasStatus: true, StatusCode: 42, EOF: true})
			}},
		{name: "agent never answers", relay: s, status: 504, words: []string{`"fake"`, badInactive.String()},
			within: badInactive + 5*time.Second,
			send:   func(t *testing.T) badResult { return e.misbehave(t, s, nil) }},
	}
	if len(tests) < 25 {
		t.Fatalf("only %d cases", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.relay
			if r == nil {
				r = m
			}
			within := tt.within
			if within == 0 {
				within = 10 * time.Second
			}
			start := time.Now()
			res := tt.send(t)
			if took := time.Since(start); took > within {
				t.Errorf("answered after %v, want within %v", took, within)
			}
			switch {
			case tt.status == 0 && !res.closed:
				t.Errorf("got %d %q, want the connection closed without an answer", res.status, res.body)
			case tt.status != 0 && res.closed:
				t.Errorf("the relay closed the connection, want %d", tt.status)
			case tt.status != 0 && res.status != tt.status:
				t.Errorf("got %d %q, want %d", res.status, strings.TrimSpace(res.body), tt.status)
			case tt.status != 0:
				checkReadable(t, res, tt.words)
			}
			if tt.retryAfter {
				if n, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || n < 1 {
					t.Errorf("Retry-After %q, want whole seconds", res.header.Get("Retry-After"))
				}
			}
			if p := e.watch.take(); len(p) > 0 {
				t.Errorf("the relay panicked: %q", p)
			}
			good := e.do(t, "GET", r.URL+"/client/dev/echo/good", nil, userHdr(e.tokens(r).user)...)
			if good.status != http.StatusOK || good.body != "ok /echo/good\n" {
				t.Errorf("a good request afterwards got %d %q", good.status, good.body)
			}
		})
	}
}
