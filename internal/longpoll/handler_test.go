package longpoll_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/fleettest"
	"github.com/switchboard-relay/switchboard/internal/longpoll"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// maxChunk is the handler's chunk limit in these tests.
const maxChunk = 4096

// authError is a refusal with a status, as the node's authorizer returns.
type authError struct {
	status int
	msg    string
}

func (e *authError) Error() string   { return e.msg }
func (e *authError) HTTPStatus() int { return e.status }

// authorize is the tests' agent authorizer: the bearer token is the agent's
// credential id; no token is 401, and devices starting with "x" are refused.
func authorize(r *http.Request, device string) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return "", &authError{http.StatusUnauthorized, "this relay needs an agent token"}
	}
	if strings.HasPrefix(device, "x") {
		return "", &authError{http.StatusForbidden, fmt.Sprintf("this agent token may not serve device %q", device)}
	}
	return token, nil
}

// env is a long-poll handler over a real broker, served by httptest.
type env struct {
	broker *broker.Broker
	srv    *httptest.Server
}

// newEnv starts a broker with cfg adjusted by opts, and the handler over it.
func newEnv(t *testing.T, opts ...func(*broker.Config)) *env {
	t.Helper()
	cfg := broker.Config{PollWait: 10 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatalf("new broker: %v", err)
	}
	h := longpoll.NewHandler(longpoll.Config{Broker: b, Authorize: authorize, MaxChunkBytes: maxChunk})
	e := &env{broker: b, srv: httptest.NewServer(h)}
	t.Cleanup(func() {
		b.Close()
		e.srv.Close()
	})
	return e
}

// reply is an answer of the handler, its body read.
type reply struct {
	status int
	header http.Header
	body   string
}

// call makes one request to the handler; token "" sends none.
func (e *env) call(t *testing.T, method, path, token string, body []byte) reply {
	t.Helper()
	return e.callCtx(t, context.Background(), method, path, token, body)
}

func (e *env) callCtx(t *testing.T, ctx context.Context, method, path, token string, body []byte) reply {
	t.Helper()
	var rd io.Reader = http.NoBody
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", wire.ContentTypeResponse)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// userResult is what a user's round trip through the broker ended with.
type userResult struct {
	resp *http.Response
	body string // read when the status is not 101
	err  error
}

// user sends a request for device through the broker, as the relay's reverse
// proxy does, and delivers the outcome on the returned channel. The request
// is cancelled and its body closed when the test ends.
func (e *env) user(t *testing.T, method, device, target string, body []byte, hdr ...string) <-chan userResult {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var rd io.Reader = http.NoBody
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+device+target, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "user.example"
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	out := make(chan userResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := e.broker.RoundTrip(req)
		res := userResult{resp: resp, err: err}
		if err == nil && resp.StatusCode != http.StatusSwitchingProtocols {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			res.body, res.err = string(b), err
		}
		out <- res
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return out
}

// await waits for a value on ch, failing the test after a deadline.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// poll starts a long poll for device as agent and returns its outcome.
func (e *env) poll(t *testing.T, device, token string) <-chan reply {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan reply, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		out <- e.callCtx(t, ctx, http.MethodGet, "/server/request?server="+device, token, nil)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return out
}

// take polls for device and returns the request handed over, once the
// device's poll is waiting so that a user request sent meanwhile finds it.
func (e *env) take(t *testing.T, device, token string, sendUser func()) *wire.Request {
	t.Helper()
	polled := e.poll(t, device, token)
	e.waitDevice(t, device)
	sendUser()
	r := await(t, polled, "the poll")
	if r.status != http.StatusOK {
		t.Fatalf("poll: %d %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != wire.ContentTypeRequest {
		t.Fatalf("poll answered Content-Type %q, want %q", ct, wire.ContentTypeRequest)
	}
	msg, err := wire.UnmarshalRequest([]byte(r.body), 1<<20)
	if err != nil {
		t.Fatalf("poll answered an undecodable HttpRequest: %v", err)
	}
	return msg
}

func (e *env) waitDevice(t *testing.T, device string) {
	t.Helper()
	fleettest.Eventually(t, 5*time.Second, func() error {
		if slices.Contains(e.broker.Devices(), device) {
			return nil
		}
		return fmt.Errorf("device %q has no poll yet", device)
	})
}

// post posts one HttpResponse chunk.
func (e *env) post(t *testing.T, token string, m *wire.Response) reply {
	t.Helper()
	return e.call(t, http.MethodPost, "/server/response", token, m.Marshal())
}

// checkText checks that an error answer is a message a person can read,
// mentioning each of words.
func checkText(t *testing.T, r reply, words ...string) {
	t.Helper()
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want text/plain", ct)
	}
	if strings.TrimSpace(r.body) == "" || !utf8.ValidString(r.body) {
		t.Errorf("body %q is not a readable message", r.body)
	}
	for _, w := range words {
		if !strings.Contains(strings.ToLower(r.body), strings.ToLower(w)) {
			t.Errorf("body %q does not mention %q", r.body, w)
		}
	}
}

var idPattern = regexp.MustCompile(`^dev:[0-9a-f]{32}$`)

func TestPollHandsOverRequest(t *testing.T) {
	e := newEnv(t)
	var res <-chan userResult
	msg := e.take(t, "dev", "agent-1", func() {
		res = e.user(t, http.MethodPost, "dev", "/a%2Fb/c?x=1&y=%20#frag", []byte("payload"), "X-Custom", "one", "X-Custom", "two")
	})
	if !idPattern.MatchString(msg.ID) {
		t.Errorf("request id %q, want dev:<32 lowercase hex>", msg.ID)
	}
	if msg.Method != http.MethodPost || string(msg.Body) != "payload" || msg.Host != "user.example" {
		t.Errorf("got %s body %q host %q", msg.Method, msg.Body, msg.Host)
	}
	if want := "http://invalid/a%2Fb/c?x=1&y=%20#frag"; msg.URL != want {
		t.Errorf("url %q, want %q", msg.URL, want)
	}
	var custom []string
	for _, h := range msg.Header {
		if h.Name == "X-Custom" {
			custom = append(custom, h.Value)
		}
	}
	if !slices.Equal(custom, []string{"one", "two"}) {
		t.Errorf("X-Custom values %q, want one entry per value", custom)
	}

	head := &wire.Response{ID: msg.ID, HasStatus: true, StatusCode: 201,
		Header: []wire.Header{{Name: "Content-Type", Value: "text/plain"}, {Name: "Trailer", Value: "X-Sum"}}, Body: []byte("hel")}
	if r := e.post(t, "agent-1", head); r.status != http.StatusOK || r.body != "ok" {
		t.Fatalf("first chunk: %d %q, want 200 ok", r.status, r.body)
	}
	for _, c := range []*wire.Response{
		{ID: msg.ID},
		{ID: msg.ID, Body: []byte("lo")},
		{ID: msg.ID, Body: []byte("!"), EOF: true, Trailer: []wire.Header{{Name: "X-Sum", Value: "42"}}},
	} {
		if r := e.post(t, "agent-1", c); r.status != http.StatusOK {
			t.Fatalf("chunk: %d %q", r.status, r.body)
		}
	}
	u := await(t, res, "the user's response")
	if u.err != nil {
		t.Fatalf("user: %v", u.err)
	}
	if u.resp.StatusCode != 201 || u.body != "hello!" || u.resp.Trailer.Get("X-Sum") != "42" {
		t.Fatalf("user got %d %q trailers %v", u.resp.StatusCode, u.body, u.resp.Trailer)
	}
	// The exchange is over: a late chunk is refused as final.
	r := e.post(t, "agent-1", &wire.Response{ID: msg.ID, Body: []byte("late")})
	if r.status != http.StatusBadRequest {
		t.Fatalf("chunk after the end: %d %q, want 400", r.status, r.body)
	}
	checkText(t, r, "unknown or finished")
}

func TestRequestEndpoint(t *testing.T) {
	e := newEnv(t, func(c *broker.Config) { c.PollWait = 20 * time.Millisecond })
	tests := []struct {
		name, path, token string
		status            int
		words             []string
	}{
		{"no server parameter", "/server/request", "agent-1", http.StatusBadRequest, []string{"server"}},
		{"empty server parameter", "/server/request?server=", "agent-1", http.StatusBadRequest, []string{"server"}},
		{"no token", "/server/request?server=dev", "", http.StatusUnauthorized, []string{"token"}},
		{"device refused", "/server/request?server=xdev", "agent-1", http.StatusForbidden, []string{`"xdev"`}},
		{"no request within the wait", "/server/request?server=dev", "agent-1", http.StatusRequestTimeout, []string{"poll again"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.call(t, http.MethodGet, tt.path, tt.token, nil)
			if r.status != tt.status {
				t.Fatalf("got %d %q, want %d", r.status, r.body, tt.status)
			}
			checkText(t, r, tt.words...)
		})
	}
}

func TestPollWhileDraining(t *testing.T) {
	e := newEnv(t)
	polled := e.poll(t, "dev", "agent-1")
	e.waitDevice(t, "dev")
	e.broker.Drain()
	r := await(t, polled, "the poll")
	if r.status != http.StatusRequestTimeout {
		t.Fatalf("a waiting poll got %d %q while draining, want 408", r.status, r.body)
	}
	checkText(t, r, "shutting down")
	r = e.call(t, http.MethodGet, "/server/request?server=dev", "agent-1", nil)
	if r.status != http.StatusRequestTimeout {
		t.Fatalf("a new poll got %d %q while draining, want 408", r.status, r.body)
	}
}

func TestResponseEndpoint(t *testing.T) {
	e := newEnv(t)
	var res <-chan userResult
	msg := e.take(t, "dev", "agent-1", func() { res = e.user(t, http.MethodGet, "dev", "/", nil) })
	unknown := "dev:" + strings.Repeat("0", 32)
	tests := []struct {
		name   string
		token  string
		body   []byte
		status int
		words  []string
	}{
		{"garbage", "agent-1", []byte("\xff\xff\xff\xff not protobuf"), http.StatusBadRequest, []string{"decode"}},
		{"truncated message", "agent-1", (&wire.Response{ID: msg.ID, Body: []byte("abcdef")}).Marshal()[:5], http.StatusBadRequest, []string{"decode"}},
		{"wrong wire type", "agent-1", []byte{0x22, 0x01}, http.StatusBadRequest, []string{"decode"}}, // field 4 (id), truncated bytes
		{"empty body", "agent-1", []byte{}, http.StatusBadRequest, []string{"id"}},
		{"no id", "agent-1", (&wire.Response{HasStatus: true, StatusCode: 200, EOF: true}).Marshal(), http.StatusBadRequest, []string{"id"}},
		{"id without device", "agent-1", (&wire.Response{ID: ":" + strings.Repeat("0", 32)}).Marshal(), http.StatusBadRequest, []string{"id"}},
		{"id without colon", "agent-1", (&wire.Response{ID: "dev"}).Marshal(), http.StatusBadRequest, []string{"id"}},
		{"id without hex", "agent-1", (&wire.Response{ID: "dev:"}).Marshal(), http.StatusBadRequest, []string{"id"}},
		{"unknown id", "agent-1", (&wire.Response{ID: unknown, HasStatus: true, StatusCode: 200}).Marshal(), http.StatusBadRequest, []string{"unknown"}},
		{"over the chunk limit", "agent-1", (&wire.Response{ID: msg.ID, Body: make([]byte, maxChunk)}).Marshal(), http.StatusRequestEntityTooLarge, []string{fmt.Sprint(maxChunk)}},
		{"no token", "", (&wire.Response{ID: msg.ID, HasStatus: true, StatusCode: 200}).Marshal(), http.StatusUnauthorized, []string{"token"}},
		{"device refused", "agent-1", (&wire.Response{ID: "xdev:" + strings.Repeat("0", 32)}).Marshal(), http.StatusForbidden, []string{`"xdev"`}},
		{"another agent's request", "agent-2", (&wire.Response{ID: msg.ID, HasStatus: true, StatusCode: 200}).Marshal(), http.StatusForbidden, []string{"another agent"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.call(t, http.MethodPost, "/server/response", tt.token, tt.body)
			if r.status != tt.status {
				t.Fatalf("got %d %q, want %d", r.status, r.body, tt.status)
			}
			checkText(t, r, tt.words...)
		})
	}
	// None of that disturbed the request: its agent still answers it.
	if r := e.post(t, "agent-1", &wire.Response{ID: msg.ID, HasStatus: true, StatusCode: 204, EOF: true}); r.status != http.StatusOK {
		t.Fatalf("the real answer: %d %q", r.status, r.body)
	}
	if u := await(t, res, "the user's response"); u.err != nil || u.resp.StatusCode != 204 {
		t.Fatalf("user got %+v", u)
	}
}

// TestFirstChunkWithoutStatus checks that the agent's post is accepted (the
// relay took it) while the user learns that the agent sent no status.
func TestFirstChunkWithoutStatus(t *testing.T) {
	tests := []struct {
		name  string
		first *wire.Response
		words []string
	}{
		{"no status", &wire.Response{Body: []byte("x"), EOF: true}, []string{"without a status code"}},
		{"status 42", &wire.Response{HasStatus: true, StatusCode: 42, EOF: true}, []string{"42"}},
		{"status 100", &wire.Response{HasStatus: true, StatusCode: 100, EOF: true}, []string{"100"}},
		{"status 1000", &wire.Response{HasStatus: true, StatusCode: 1000, EOF: true}, []string{"1000"}},
		{"negative status", &wire.Response{HasStatus: true, StatusCode: -200, EOF: true}, []string{"-200"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			var res <-chan userResult
			msg := e.take(t, "dev", "agent-1", func() { res = e.user(t, http.MethodGet, "dev", "/", nil) })
			tt.first.ID = msg.ID
			if r := e.post(t, "agent-1", tt.first); r.status != http.StatusOK {
				t.Fatalf("post: %d %q", r.status, r.body)
			}
			u := await(t, res, "the user's response")
			var be *broker.Error
			if !errors.As(u.err, &be) || be.Status != http.StatusBadGateway {
				t.Fatalf("user got %+v, want a 502 broker.Error", u)
			}
			for _, w := range append(tt.words, `"dev"`) {
				if !strings.Contains(be.Message, w) {
					t.Errorf("message %q does not mention %q", be.Message, w)
				}
			}
		})
	}
}

func TestRequestStreamEndpoint(t *testing.T) {
	e := newEnv(t, func(c *broker.Config) {
		c.RequestStreamWait = 50 * time.Millisecond
		c.BlockSize = 4
	})
	var res <-chan userResult
	msg := e.take(t, "dev", "agent-1", func() {
		res = e.user(t, http.MethodGet, "dev", "/ws", nil, "Connection", "Upgrade", "Upgrade", "echo")
	})
	stream := "/server/requeststream?id=" + msg.ID
	head := &wire.Response{ID: msg.ID, HasStatus: true, StatusCode: http.StatusSwitchingProtocols,
		Header: []wire.Header{{Name: "Connection", Value: "Upgrade"}, {Name: "Upgrade", Value: "echo"}}}
	if r := e.post(t, "agent-1", head); r.status != http.StatusOK {
		t.Fatalf("101 head: %d %q", r.status, r.body)
	}
	u := await(t, res, "the user's 101")
	if u.err != nil || u.resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("user got %+v, want 101", u)
	}
	conn, ok := u.resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("the 101's body is a %T, not an io.ReadWriteCloser", u.resp.Body)
	}
	defer conn.Close()

	errs := []struct {
		name, path, token string
		status            int
		words             []string
	}{
		{"no id", "/server/requeststream", "agent-1", http.StatusBadRequest, []string{"id"}},
		{"malformed id", "/server/requeststream?id=nocolon", "agent-1", http.StatusBadRequest, []string{"id"}},
		{"unknown id", "/server/requeststream?id=dev:" + strings.Repeat("0", 32), "agent-1", http.StatusGone, []string{"unknown"}},
		{"no token", stream, "", http.StatusUnauthorized, []string{"token"}},
		{"another agent", stream, "agent-2", http.StatusForbidden, []string{"another agent"}},
		{"device refused", "/server/requeststream?id=xdev:00", "agent-1", http.StatusForbidden, []string{`"xdev"`}},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			r := e.call(t, http.MethodPost, tt.path, tt.token, nil)
			if r.status != tt.status {
				t.Fatalf("got %d %q, want %d", r.status, r.body, tt.status)
			}
			checkText(t, r, tt.words...)
		})
	}

	// Nothing sent yet: the call ends empty after the wait and the agent loops.
	if r := e.call(t, http.MethodPost, stream, "agent-1", nil); r.status != http.StatusOK || r.body != "" {
		t.Fatalf("idle requeststream: %d %q, want 200 and no body", r.status, r.body)
	}

	// The user's bytes come in pieces of at most BlockSize.
	wrote := make(chan error, 1)
	go func() {
		_, err := conn.Write([]byte("hello world"))
		wrote <- err
	}()
	var got string
	for len(got) < len("hello world") {
		r := e.call(t, http.MethodPost, stream, "agent-1", nil)
		if r.status != http.StatusOK {
			t.Fatalf("requeststream: %d %q", r.status, r.body)
		}
		if ct := r.header.Get("Content-Type"); ct != "application/octet-data" {
			t.Fatalf("requeststream Content-Type %q, want application/octet-data", ct)
		}
		if len(r.body) > 4 {
			t.Fatalf("requeststream handed %d bytes, more than the block size 4", len(r.body))
		}
		got += r.body
	}
	if got != "hello world" {
		t.Fatalf("agent got %q", got)
	}
	if err := await(t, wrote, "the user's write"); err != nil {
		t.Fatalf("user write: %v", err)
	}

	// The device's bytes reach the user; the post returns once the user
	// side took them (flow control).
	posted := make(chan reply, 1)
	go func() { posted <- e.post(t, "agent-1", &wire.Response{ID: msg.ID, Body: []byte("from device")}) }()
	buf := make([]byte, len("from device"))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "from device" {
		t.Fatalf("user read %q, %v", buf, err)
	}
	if r := await(t, posted, "the device bytes' post"); r.status != http.StatusOK {
		t.Fatalf("device bytes: %d %q", r.status, r.body)
	}

	// The user closes its side: the agent is told the stream is over.
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("the 101's body %T has no CloseWrite", conn)
	}
	cw.CloseWrite()
	r := e.call(t, http.MethodPost, stream, "agent-1", nil)
	if r.status != http.StatusGone {
		t.Fatalf("requeststream after the user closed: %d %q, want 410", r.status, r.body)
	}
	checkText(t, r, "closed")

	// The user goes away: the exchange is over for both endpoints.
	conn.Close()
	if r := e.call(t, http.MethodPost, stream, "agent-1", nil); r.status != http.StatusGone {
		t.Fatalf("requeststream after the end: %d %q, want 410", r.status, r.body)
	}
	if r := e.post(t, "agent-1", &wire.Response{ID: msg.ID, Body: []byte("late")}); r.status != http.StatusBadRequest {
		t.Fatalf("chunk after the end: %d %q, want 400", r.status, r.body)
	}
}

func TestUnknownEndpoints(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		method, path string
		status       int
		allow        string // the method the Allow header of a 405 names
		words        []string
	}{
		{http.MethodGet, "/server/nope", http.StatusNotFound, "", []string{"/server/nope"}},
		{http.MethodPost, "/server/", http.StatusNotFound, "", []string{"/server/"}},
		{http.MethodGet, "/server/response", http.StatusMethodNotAllowed, "POST", []string{"POST"}},
		{http.MethodPut, "/server/response", http.StatusMethodNotAllowed, "POST", []string{"POST"}},
		{http.MethodGet, "/server/requeststream?id=dev:00", http.StatusMethodNotAllowed, "POST", []string{"POST"}},
		{http.MethodPost, "/server/request?server=dev", http.StatusMethodNotAllowed, "GET", []string{"GET"}},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			r := e.call(t, tt.method, tt.path, "agent-1", nil)
			if r.status != tt.status {
				t.Fatalf("got %d %q, want %d", r.status, r.body, tt.status)
			}
			if tt.allow != "" && !strings.Contains(r.header.Get("Allow"), tt.allow) {
				t.Errorf("Allow %q, want %q", r.header.Get("Allow"), tt.allow)
			}
			checkText(t, r, tt.words...)
		})
	}
}

// TestExpiredRequestsLeaveTheQueue checks that a request that no agent
// picked up in time stops counting against the device's pending limit: the
// next user must get the same "nobody picked it up" answer, not "too many
// requests waiting" while none is.
func TestExpiredRequestsLeaveTheQueue(t *testing.T) {
	e := newEnv(t, func(c *broker.Config) {
		c.MaxPendingPerDevice = 1
		c.PollWait = 10 * time.Millisecond
		c.NoAgentGrace = 50 * time.Millisecond
		c.PickupTimeout = 50 * time.Millisecond
	})
	// An agent polled once and went away: the device is known, nobody polls.
	if r := e.call(t, http.MethodGet, "/server/request?server=dev", "agent-1", nil); r.status != http.StatusRequestTimeout {
		t.Fatalf("poll: %d %q, want 408", r.status, r.body)
	}

	for i := range 3 {
		u := await(t, e.user(t, http.MethodGet, "dev", "/", nil), "the user's answer")
		var be *broker.Error
		if !errors.As(u.err, &be) || be.Status != http.StatusServiceUnavailable {
			t.Fatalf("request %d: got %+v, want a 503", i, u)
		}
		if !strings.Contains(be.Message, "picked up") {
			t.Fatalf("request %d: %q, want the pickup timeout (no request is waiting)", i, be.Message)
		}
	}
}

// forwardedPoll starts a poll as a relay forwards one (wire.PollEndHeader,
// over HTTP/2 as between relays): its body stays open until end is called.
func (e *env) forwardedPoll(t *testing.T, device, token string) (answer <-chan reply, end func()) {
	t.Helper()
	body, w := io.Pipe()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/server/request?server="+device, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(wire.PollEndHeader, "1")
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	out := make(chan reply, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			out <- reply{status: -1, body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}()
	t.Cleanup(func() { w.Close() })
	return out, func() { w.Close() }
}

// h2cEnv is newEnv with the handler served over HTTP/2 without TLS too, as
// relays serve each other.
func h2cEnv(t *testing.T) *env {
	t.Helper()
	b, err := broker.New(broker.Config{PollWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(longpoll.NewHandler(longpoll.Config{Broker: b, Authorize: authorize, MaxChunkBytes: maxChunk}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	e := &env{broker: b, srv: srv}
	t.Cleanup(func() {
		b.Close()
		srv.Close()
	})
	return e
}

func TestForwardedPollEndsWithItsBody(t *testing.T) {
	t.Run("ended before a request came", func(t *testing.T) {
		e := h2cEnv(t)
		answer, end := e.forwardedPoll(t, "dev", "agent-1")
		e.waitDevice(t, "dev")
		end()
		r := await(t, answer, "the ended poll")
		if r.status != http.StatusRequestTimeout || !strings.Contains(r.body, "poll again") {
			t.Fatalf("ended poll: %d %q, want 408 asking to poll again", r.status, r.body)
		}
		// Nothing was taken: the next request goes to the next poll.
		var res <-chan userResult
		msg := e.take(t, "dev", "agent-1", func() { res = e.user(t, http.MethodGet, "dev", "/after", nil) })
		if msg.URL != "http://invalid/after" {
			t.Fatalf("next poll got %q", msg.URL)
		}
		e.post(t, "agent-1", &wire.Response{ID: msg.ID, HasStatus: true, StatusCode: 204, EOF: true})
		if u := await(t, res, "the user's response"); u.err != nil || u.resp.StatusCode != 204 {
			t.Fatalf("user: %v %v", u.err, u.resp)
		}
	})
	t.Run("a request handed over before the end still arrives", func(t *testing.T) {
		e := h2cEnv(t)
		answer, end := e.forwardedPoll(t, "dev", "agent-1")
		e.waitDevice(t, "dev")
		res := e.user(t, http.MethodGet, "dev", "/taken", nil)
		r := await(t, answer, "the poll")
		end()
		if r.status != http.StatusOK {
			t.Fatalf("poll: %d %q, want 200 with the request", r.status, r.body)
		}
		msg, err := wire.UnmarshalRequest([]byte(r.body), 1<<20)
		if err != nil || msg.URL != "http://invalid/taken" {
			t.Fatalf("poll answered %q (%v)", r.body, err)
		}
		e.post(t, "agent-1", &wire.Response{ID: msg.ID, HasStatus: true, StatusCode: 204, EOF: true})
		if u := await(t, res, "the user's response"); u.err != nil || u.resp.StatusCode != 204 {
			t.Fatalf("user: %v %v", u.err, u.resp)
		}
	})
}
