package agent_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait is how long a test waits for something that should happen at once.
const wait = 10 * time.Second

// call is one request the agent made to the fake relay, waiting for the
// test to answer it.
type call struct {
	r     *http.Request
	body  []byte
	at    time.Time
	reply chan answer
}

// answer is the fake relay's answer to a call.
type answer struct {
	status int
	ctype  string
	body   []byte
	drop   bool // close the connection without answering
}

// fakeRelay implements the relay side of the long-poll protocol as the
// test scripts it: every call to an agent endpoint is handed to the test,
// which answers it. Calls to any other path fail the test.
type fakeRelay struct {
	srv     *httptest.Server
	polls   chan *call // GET .../server/request
	chunks  chan *call // POST .../server/response
	streams chan *call // POST .../server/requeststream

	mu     sync.Mutex // guards the fields below
	counts map[string]int
	stray  []string
}

func newFakeRelay(t *testing.T) *fakeRelay {
	t.Helper()
	f := &fakeRelay{
		polls:   make(chan *call),
		chunks:  make(chan *call),
		streams: make(chan *call),
		counts:  make(map[string]int),
	}
	f.srv = httptest.NewServer(f)
	t.Cleanup(func() {
		f.srv.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.stray) > 0 {
			t.Errorf("the agent called paths that are no agent endpoints: %q", f.stray)
		}
	})
	return f
}

func (f *fakeRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	var ch chan *call
	switch {
	case strings.HasSuffix(r.URL.Path, "/server/request"):
		ch = f.polls
	case strings.HasSuffix(r.URL.Path, "/server/response"):
		ch = f.chunks
	case strings.HasSuffix(r.URL.Path, "/server/requeststream"):
		ch = f.streams
	default:
		f.mu.Lock()
		f.stray = append(f.stray, r.Method+" "+r.URL.String())
		f.mu.Unlock()
		http.Error(w, "not an agent endpoint", http.StatusNotFound)
		return
	}
	f.mu.Lock()
	f.counts[r.URL.Path[strings.LastIndex(r.URL.Path, "/server/"):]]++
	f.mu.Unlock()
	c := &call{r: r, body: body, at: time.Now(), reply: make(chan answer, 1)}
	select {
	case ch <- c:
	case <-r.Context().Done():
		return
	}
	var a answer
	select {
	case a = <-c.reply:
	case <-r.Context().Done():
		return
	}
	if a.drop {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	if a.ctype == "" {
		a.ctype = "text/plain; charset=utf-8"
	}
	w.Header().Set("Content-Type", a.ctype)
	w.WriteHeader(a.status)
	w.Write(a.body)
}

// count returns how many calls reached the endpoint path ("/server/…").
func (f *fakeRelay) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[path]
}

func next(t *testing.T, ch chan *call, what string) *call {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(wait):
		t.Fatalf("the agent made no %s within %v", what, wait)
		return nil
	}
}

func (c *call) answer(status int, body string) {
	c.reply <- answer{status: status, body: []byte(body)}
}

// nextPoll waits for the agent's next poll.
func (f *fakeRelay) nextPoll(t *testing.T) *call {
	t.Helper()
	return next(t, f.polls, "poll")
}

// hand answers the agent's next poll with msg and returns the poll.
func (f *fakeRelay) hand(t *testing.T, msg *wire.Request) *call {
	t.Helper()
	c := f.nextPoll(t)
	c.reply <- answer{status: http.StatusOK, ctype: wire.ContentTypeRequest, body: msg.Marshal()}
	return c
}

// nextChunk waits for the agent's next response chunk, checks how it was
// posted, and answers it with status.
func (f *fakeRelay) nextChunk(t *testing.T, status int) (*wire.Response, *call) {
	t.Helper()
	c := next(t, f.chunks, "response chunk")
	if c.r.Method != http.MethodPost {
		t.Errorf("chunk posted with %s", c.r.Method)
	}
	if ct := c.r.Header.Get("Content-Type"); ct != wire.ContentTypeResponse {
		t.Errorf("chunk posted with Content-Type %q, want %q", ct, wire.ContentTypeResponse)
	}
	m, err := wire.UnmarshalResponse(c.body, 64<<20)
	if err != nil {
		c.answer(http.StatusBadRequest, err.Error())
		t.Fatalf("the agent posted an undecodable chunk: %v", err)
	}
	c.answer(status, "ok")
	return m, c
}

// runAgent runs an agent until the test ends and returns a channel that
// delivers what Run returned. It is stopped before the fake relay closes.
func runAgent(t *testing.T, cfg agent.Config) (stop func() error, done <-chan error) {
	t.Helper()
	cfg.Protocol = agent.ProtocolLongPoll
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("new agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	finished := make(chan struct{})
	var runErr error
	go func() {
		defer close(finished)
		runErr = a.Run(ctx)
		errc <- runErr
	}()
	stop = func() error {
		cancel()
		select {
		case <-finished:
		case <-time.After(wait):
			t.Fatalf("Run did not return within %v of its context ending", wait)
		}
		return runErr
	}
	t.Cleanup(func() { stop() })
	return stop, errc
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// config is an agent config for device "dev" against f and backend.
func config(t *testing.T, f *fakeRelay, backend string) agent.Config {
	return agent.Config{
		Relays:       []*url.URL{mustURL(t, f.srv.URL)},
		Device:       "dev",
		Backend:      mustURL(t, backend),
		Token:        "sba_secret",
		PreserveHost: true,
	}
}

// newID returns a request id for device in the protocol's format.
func newID(n int) string { return fmt.Sprintf("dev:%032x", n) }

// backend starts a test backend serving h.
func backend(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

func hello(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Backend", "yes")
	io.WriteString(w, "hello")
}

// deadPort returns a loopback address where nothing listens.
func deadPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func header(hs []wire.Header, name string) []string {
	var vs []string
	for _, h := range hs {
		if http.CanonicalHeaderKey(h.Name) == http.CanonicalHeaderKey(name) {
			vs = append(vs, h.Value)
		}
	}
	return vs
}

func TestWire(t *testing.T) {
	tests := []struct {
		name       string
		relayPath  string // appended to the relay's URL
		prefix     string // Config.RelayPrefix
		token      string
		wantPrefix string // the path before /server/...
	}{
		{name: "no prefix", token: "sba_secret"},
		{name: "prefix", prefix: "/edge", token: "sba_secret", wantPrefix: "/edge"},
		{name: "prefix without slashes", prefix: "edge/relay", token: "sba_secret", wantPrefix: "/edge/relay"},
		{name: "prefix with slashes", prefix: "/edge/", token: "sba_secret", wantPrefix: "/edge"},
		{name: "relay URL path and prefix", relayPath: "/base/", prefix: "/edge", token: "sba_secret", wantPrefix: "/base/edge"},
		{name: "anonymous agent", token: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeRelay(t)
			b := backend(t, hello)
			cfg := config(t, f, b.URL)
			cfg.Relays = []*url.URL{mustURL(t, f.srv.URL+tt.relayPath)}
			cfg.RelayPrefix = tt.prefix
			cfg.Token = tt.token
			cfg.Device = "robot-7.lab_2"
			runAgent(t, cfg)

			id := "robot-7.lab_2:" + strings.Repeat("ab", 16)
			p := f.hand(t, &wire.Request{ID: id, Method: http.MethodGet, URL: "http://invalid/", Host: "relay.example"})
			if p.r.Method != http.MethodGet || p.r.URL.Path != tt.wantPrefix+"/server/request" {
				t.Errorf("poll: %s %s, want GET %s/server/request", p.r.Method, p.r.URL.Path, tt.wantPrefix)
			}
			if q := p.r.URL.RawQuery; q != "server=robot-7.lab_2" {
				t.Errorf("poll query %q, want server=robot-7.lab_2", q)
			}
			checkCredentials(t, p.r, tt.token)
			instance := p.r.Header.Get(wire.InstanceHeader)
			if instance == "" {
				t.Errorf("poll without %s", wire.InstanceHeader)
			}

			m, c := f.nextChunk(t, http.StatusOK)
			if c.r.URL.Path != tt.wantPrefix+"/server/response" || c.r.URL.RawQuery != "" {
				t.Errorf("chunk posted to %s, want %s/server/response", c.r.URL, tt.wantPrefix)
			}
			checkCredentials(t, c.r, tt.token)
			if got := c.r.Header.Get(wire.InstanceHeader); got != instance {
				t.Errorf("chunk names instance %q, the poll %q", got, instance)
			}
			if m.ID != id || !m.HasStatus || m.StatusCode != http.StatusOK || string(m.Body) != "hello" || !m.EOF {
				t.Errorf("chunk %+v, want the whole answer to %s", m, id)
			}
			f.nextPoll(t) // the agent polls again
		})
	}
}

func checkCredentials(t *testing.T, r *http.Request, token string) {
	t.Helper()
	got := r.Header.Values("Authorization")
	switch {
	case token == "" && len(got) > 0:
		t.Errorf("an agent without a token sent Authorization %q", got)
	case token != "" && !slices.Equal(got, []string{"Bearer " + token}):
		t.Errorf("Authorization %q, want [Bearer %s]", got, token)
	}
}

func TestTimeoutRepollsAtOnce(t *testing.T) {
	f := newFakeRelay(t)
	b := backend(t, hello)
	runAgent(t, config(t, f, b.URL))
	// With backoff, 30 polls in a row would take a minute or more.
	const n = 30
	start := time.Now()
	for range n {
		f.nextPoll(t).answer(http.StatusRequestTimeout, "no request for this device within the poll wait; poll again")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("%d polls answered 408 took %v; the agent must re-poll at once", n, took)
	}
	f.hand(t, &wire.Request{ID: newID(1), Method: http.MethodGet, URL: "http://invalid/"})
	if m, _ := f.nextChunk(t, http.StatusOK); m.StatusCode != http.StatusOK {
		t.Fatalf("after the 408s the agent answered %+v", m)
	}
}

func TestRefusedCredential(t *testing.T) {
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		for _, after408 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d after 408 %v", status, after408), func(t *testing.T) {
				f := newFakeRelay(t)
				b := backend(t, hello)
				cfg := config(t, f, b.URL)
				cfg.NumPendingRequests = 3
				_, done := runAgent(t, cfg)
				if after408 {
					f.nextPoll(t).answer(http.StatusRequestTimeout, "poll again")
				}
				f.nextPoll(t).answer(status, `this agent token may not serve device "dev"`)
				select {
				case err := <-done:
					if !errors.Is(err, agent.ErrUnauthorized) {
						t.Fatalf("Run returned %v, want an error wrapping ErrUnauthorized", err)
					}
					if !strings.Contains(err.Error(), `may not serve device "dev"`) {
						t.Errorf("Run's error %q does not carry the relay's reason", err)
					}
				case <-time.After(wait):
					t.Fatalf("Run still running %v after a %d", wait, status)
				}
			})
		}
	}
}

func TestRetriesWithBackoff(t *testing.T) {
	tests := []struct {
		name string
		fail answer
	}{
		{"500", answer{status: http.StatusInternalServerError, body: []byte("boom")}},
		{"502", answer{status: http.StatusBadGateway, body: []byte("bad gateway")}},
		{"503", answer{status: http.StatusServiceUnavailable, body: []byte("draining")}},
		{"connection dropped", answer{drop: true}},
		{"undecodable request", answer{status: http.StatusOK, ctype: wire.ContentTypeRequest, body: []byte{0xff, 0xff}}},
		{"404 of a relay without the protocol", answer{status: http.StatusNotFound, body: []byte("404 page not found")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeRelay(t)
			b := backend(t, hello)
			_, done := runAgent(t, config(t, f, b.URL))
			// Three failures in a row: delays drawn from [0,100ms), [0,250ms)
			// and [0,500ms), together under 2 ms with a chance of about 1e-7.
			// (A dropped poll is not retried by the Go transport itself: each
			// drop closes the connection, and fresh connections are not retried.)
			const failures = 3
			var at []time.Time
			for range failures {
				c := f.nextPoll(t)
				at = append(at, c.at)
				c.reply <- tt.fail
			}
			c := f.nextPoll(t)
			at = append(at, c.at)
			c.reply <- answer{status: http.StatusOK, ctype: wire.ContentTypeRequest,
				body: (&wire.Request{ID: newID(1), Method: http.MethodGet, URL: "http://invalid/"}).Marshal()}
			if m, _ := f.nextChunk(t, http.StatusOK); string(m.Body) != "hello" {
				t.Fatalf("after the failures the agent answered %+v", m)
			}
			if took := at[len(at)-1].Sub(at[0]); took < 2*time.Millisecond {
				t.Errorf("%d failed polls retried within %v: no backoff", failures, took)
			}
			select {
			case err := <-done:
				t.Fatalf("Run returned %v after transient failures", err)
			default:
			}
		})
	}
}

func TestFailsOverToNextRelay(t *testing.T) {
	f := newFakeRelay(t)
	b := backend(t, hello)
	cfg := config(t, f, b.URL)
	cfg.Relays = []*url.URL{mustURL(t, "http://"+deadPort(t)), mustURL(t, f.srv.URL)}
	runAgent(t, cfg)
	f.hand(t, &wire.Request{ID: newID(1), Method: http.MethodGet, URL: "http://invalid/"})
	if m, _ := f.nextChunk(t, http.StatusOK); string(m.Body) != "hello" {
		t.Fatalf("answer %+v", m)
	}
}

func TestBackendRequest(t *testing.T) {
	type seen struct {
		method, path, rawPath, query, host, body string
		header                                   http.Header
		contentLength                            int64
	}
	tests := []struct {
		name         string
		backendPath  string
		preserveHost bool
		msg          wire.Request
		want         seen
	}{
		{
			name: "path and query", preserveHost: true,
			msg:  wire.Request{Method: http.MethodGet, URL: "http://invalid/a/b?x=1&y=%20#frag", Host: "relay.example"},
			want: seen{method: "GET", path: "/a/b", query: "x=1&y=%20", host: "relay.example"},
		},
		{
			name: "backend path is prepended", backendPath: "/api/v1", preserveHost: true,
			msg:  wire.Request{Method: http.MethodGet, URL: "http://invalid/things", Host: "relay.example"},
			want: seen{method: "GET", path: "/api/v1/things", host: "relay.example"},
		},
		{
			name: "backend path with trailing slash", backendPath: "/api/", preserveHost: true,
			msg:  wire.Request{Method: http.MethodGet, URL: "http://invalid/things/", Host: "relay.example"},
			want: seen{method: "GET", path: "/api/things/", host: "relay.example"},
		},
		{
			name: "escaped path keeps its encoding", backendPath: "/api", preserveHost: true,
			msg:  wire.Request{Method: http.MethodGet, URL: "http://invalid/a%2Fb/c", Host: "relay.example"},
			want: seen{method: "GET", path: "/api/a/b/c", rawPath: "/api/a%2Fb/c", host: "relay.example"},
		},
		{
			name: "root", backendPath: "/api", preserveHost: true,
			msg:  wire.Request{Method: http.MethodGet, URL: "http://invalid/", Host: "relay.example"},
			want: seen{method: "GET", path: "/api/", host: "relay.example"},
		},
		{
			name: "host not preserved", preserveHost: false,
			msg:  wire.Request{Method: http.MethodGet, URL: "http://invalid/", Host: "relay.example"},
			want: seen{method: "GET", path: "/", host: "backend"},
		},
		{
			name: "no host in the message", preserveHost: true,
			msg:  wire.Request{Method: http.MethodGet, URL: "http://invalid/"},
			want: seen{method: "GET", path: "/", host: "backend"},
		},
		{
			name: "method body and headers", preserveHost: true,
			msg: wire.Request{Method: http.MethodPut, URL: "http://invalid/up", Host: "relay.example", Body: []byte("payload"),
				Header: []wire.Header{{Name: "X-Custom", Value: "one"}, {Name: "X-Custom", Value: "two"}, {Name: "Content-Type", Value: "text/plain"}}},
			want: seen{method: "PUT", path: "/up", host: "relay.example", body: "payload", contentLength: 7,
				header: http.Header{"X-Custom": {"one", "two"}, "Content-Type": {"text/plain"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan seen, 1)
			b := backend(t, func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				got <- seen{method: r.Method, path: r.URL.Path, rawPath: r.URL.RawPath, query: r.URL.RawQuery,
					host: r.Host, body: string(body), header: r.Header, contentLength: r.ContentLength}
			})
			f := newFakeRelay(t)
			cfg := config(t, f, b.URL+tt.backendPath)
			cfg.PreserveHost = tt.preserveHost
			runAgent(t, cfg)
			tt.msg.ID = newID(1)
			f.hand(t, &tt.msg)
			var s seen
			select {
			case s = <-got:
			case <-time.After(wait):
				t.Fatal("the backend got no request")
			}
			if tt.want.host == "backend" {
				tt.want.host = strings.TrimPrefix(b.URL, "http://")
			}
			if s.method != tt.want.method || s.path != tt.want.path || s.rawPath != tt.want.rawPath ||
				s.query != tt.want.query || s.host != tt.want.host || s.body != tt.want.body || s.contentLength != tt.want.contentLength {
				t.Errorf("backend saw %s path %q raw %q query %q host %q body %q length %d,\nwant %s path %q raw %q query %q host %q body %q length %d",
					s.method, s.path, s.rawPath, s.query, s.host, s.body, s.contentLength,
					tt.want.method, tt.want.path, tt.want.rawPath, tt.want.query, tt.want.host, tt.want.body, tt.want.contentLength)
			}
			for k, vv := range tt.want.header {
				if !slices.Equal(s.header.Values(k), vv) {
					t.Errorf("backend saw %s %q, want %q", k, s.header.Values(k), vv)
				}
			}
			if m, _ := f.nextChunk(t, http.StatusOK); m.StatusCode != http.StatusOK || !m.EOF {
				t.Errorf("answer %+v", m)
			}
		})
	}
}

func TestSmallResponseIsOneChunk(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
	}{
		{"ok", http.StatusOK, "hello"},
		{"created", http.StatusCreated, `{"id":1}`},
		{"not found", http.StatusNotFound, "no such thing\n"},
		{"empty", http.StatusNoContent, ""},
		{"exactly the chunk size", http.StatusOK, strings.Repeat("x", 64)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := backend(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Backend", "yes")
				w.Header().Set("Content-Length", fmt.Sprint(len(tt.body)))
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			f := newFakeRelay(t)
			cfg := config(t, f, b.URL)
			cfg.MaxChunkSize = 64
			stop, _ := runAgent(t, cfg)
			f.hand(t, &wire.Request{ID: newID(7), Method: http.MethodGet, URL: "http://invalid/"})
			m, _ := f.nextChunk(t, http.StatusOK)
			if m.ID != newID(7) || !m.HasStatus || int(m.StatusCode) != tt.status || string(m.Body) != tt.body || !m.EOF {
				t.Fatalf("chunk %+v, want status %d, body %q and eof in one", m, tt.status, tt.body)
			}
			if got := header(m.Header, "X-Backend"); !slices.Equal(got, []string{"yes"}) {
				t.Errorf("X-Backend %q", got)
			}
			if m.BackendDurationMS < 0 || len(m.Trailer) != 0 {
				t.Errorf("duration %d trailers %v", m.BackendDurationMS, m.Trailer)
			}
			stop()
			if n := f.count("/server/response"); n != 1 {
				t.Errorf("the agent posted %d chunks, want 1", n)
			}
		})
	}
}

func TestStreamedResponse(t *testing.T) {
	release := make(chan struct{})
	b := backend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "part1")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "part2")
		w.Header().Set("X-Checksum", "abc123")
		w.Header().Set(http.TrailerPrefix+"X-Late", "undeclared")
	})
	f := newFakeRelay(t)
	cfg := config(t, f, b.URL)
	cfg.KeepAlive = 20 * time.Millisecond
	runAgent(t, cfg)
	f.hand(t, &wire.Request{ID: newID(3), Method: http.MethodGet, URL: "http://invalid/events"})

	head, _ := f.nextChunk(t, http.StatusOK)
	if !head.HasStatus || head.StatusCode != http.StatusOK || head.EOF || len(head.Body) != 0 {
		t.Fatalf("first chunk %+v, want the head alone", head)
	}
	if got := header(head.Header, "Content-Type"); !slices.Equal(got, []string{"text/event-stream"}) {
		t.Errorf("head Content-Type %q", got)
	}
	if got := header(head.Header, "Trailer"); !slices.Equal(got, []string{"X-Checksum"}) {
		t.Errorf("head announces trailers %q, want X-Checksum", got)
	}
	// part1 arrives while the backend still holds part2.
	m, _ := f.nextChunk(t, http.StatusOK)
	if string(m.Body) != "part1" || m.HasStatus || m.EOF || len(m.Trailer) != 0 {
		t.Fatalf("second chunk %+v, want part1 alone", m)
	}
	// An idle stream is kept alive with empty chunks.
	m, _ = f.nextChunk(t, http.StatusOK)
	if len(m.Body) != 0 || m.HasStatus || m.EOF || len(m.Trailer) != 0 || m.ID != newID(3) {
		t.Fatalf("chunk while idle %+v, want an empty keep-alive", m)
	}
	close(release)
	var body string
	for {
		m, _ := f.nextChunk(t, http.StatusOK)
		if m.HasStatus {
			t.Fatalf("a later chunk carries a status: %+v", m)
		}
		body += string(m.Body)
		if !m.EOF {
			if len(m.Trailer) != 0 {
				t.Errorf("trailers %v before the last chunk", m.Trailer)
			}
			continue
		}
		if got := header(m.Trailer, "X-Checksum"); !slices.Equal(got, []string{"abc123"}) {
			t.Errorf("last chunk's X-Checksum %q (trailers %v)", got, m.Trailer)
		}
		if got := header(m.Trailer, "X-Late"); !slices.Equal(got, []string{"undeclared"}) {
			t.Errorf("last chunk's X-Late %q (trailers %v)", got, m.Trailer)
		}
		if len(header(m.Trailer, wire.AbortTrailer)) > 0 {
			t.Errorf("a clean end carries %s: %v", wire.AbortTrailer, m.Trailer)
		}
		break
	}
	if body != "part2" {
		t.Fatalf("body after part1: %q", body)
	}
}

// TestChunksRespectMaxChunkSize checks that no chunk carries more response
// bytes than MaxChunkSize, whatever the backend's write and read sizes.
func TestChunksRespectMaxChunkSize(t *testing.T) {
	payload := strings.Repeat("0123456789abcdefghijklmnopqrstuvwxyz", 100)
	b := backend(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK) // no Content-Length: streamed
		io.WriteString(w, payload)
	})
	f := newFakeRelay(t)
	cfg := config(t, f, b.URL)
	cfg.MaxChunkSize = 100
	cfg.BlockSize = 64
	runAgent(t, cfg)
	f.hand(t, &wire.Request{ID: newID(4), Method: http.MethodGet, URL: "http://invalid/"})
	var body string
	var over []int
	for {
		m, _ := f.nextChunk(t, http.StatusOK)
		if len(m.Body) > cfg.MaxChunkSize {
			over = append(over, len(m.Body))
		}
		body += string(m.Body)
		if m.EOF {
			break
		}
	}
	if body != payload {
		t.Fatalf("got %d bytes, want %d", len(body), len(payload))
	}
	if len(over) > 0 {
		t.Fatalf("chunks of %v body bytes, more than MaxChunkSize %d", over, cfg.MaxChunkSize)
	}
}

func TestRefusedChunkStopsResponse(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusGone} {
		for _, on := range []string{"head", "body"} {
			t.Run(fmt.Sprintf("%d on %s", status, on), func(t *testing.T) {
				cancelled := make(chan struct{})
				b := backend(t, func(w http.ResponseWriter, r *http.Request) {
					w.WriteHeader(http.StatusOK)
					io.WriteString(w, "part1")
					w.(http.Flusher).Flush()
					<-r.Context().Done()
					close(cancelled)
				})
				f := newFakeRelay(t)
				stop, _ := runAgent(t, config(t, f, b.URL))
				f.hand(t, &wire.Request{ID: newID(5), Method: http.MethodGet, URL: "http://invalid/"})
				want := 1
				if on == "body" {
					f.nextChunk(t, http.StatusOK)
					want = 2
				}
				f.nextChunk(t, status)
				select {
				case <-cancelled:
				case <-time.After(wait):
					t.Fatalf("the backend request still runs %v after the relay answered %d", wait, status)
				}
				f.nextPoll(t) // the agent carries on
				stop()
				if n := f.count("/server/response"); n != want {
					t.Errorf("the agent posted %d chunks, want %d: a %d is final", n, want, status)
				}
			})
		}
	}
}

// echoLinesBackend switches to the "echo-lines" protocol and echoes each
// line until "bye"; done is closed when it has closed the connection.
func echoLinesBackend(t *testing.T) (b *httptest.Server, done <-chan struct{}) {
	backendDone := make(chan struct{})
	b = backend(t, func(w http.ResponseWriter, r *http.Request) {
		defer close(backendDone)
		if r.Header.Get("Upgrade") != "echo-lines" {
			http.Error(w, "want Upgrade: echo-lines", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo-lines\r\n\r\n")
		brw.Flush()
		sc := bufio.NewScanner(brw)
		for sc.Scan() {
			fmt.Fprintf(conn, "echo: %s\n", sc.Text())
			if sc.Text() == "bye" {
				return
			}
		}
	})
	return b, backendDone
}

// upgradeRequest is a request to switch to echo-lines.
func upgradeRequest(id string) *wire.Request {
	return &wire.Request{ID: id, Method: http.MethodGet, URL: "http://invalid/exec",
		Header: []wire.Header{{Name: "Connection", Value: "Upgrade"}, {Name: "Upgrade", Value: "echo-lines"}}}
}

func TestUpgrade(t *testing.T) {
	b, backendDone := echoLinesBackend(t)
	f := newFakeRelay(t)
	cfg := config(t, f, b.URL)
	cfg.RelayPrefix = "/edge"
	runAgent(t, cfg)
	id := newID(9)
	f.hand(t, upgradeRequest(id))

	head, _ := f.nextChunk(t, http.StatusOK)
	if !head.HasStatus || head.StatusCode != http.StatusSwitchingProtocols || head.EOF {
		t.Fatalf("first chunk %+v, want a 101 head", head)
	}
	if got := header(head.Header, "Upgrade"); !slices.Equal(got, []string{"echo-lines"}) {
		t.Errorf("101 Upgrade %q", got)
	}

	stream := func() *call {
		t.Helper()
		c := next(t, f.streams, "requeststream call")
		if c.r.Method != http.MethodPost || c.r.URL.Path != "/edge/server/requeststream" || c.r.URL.Query().Get("id") != id || len(c.body) != 0 {
			t.Errorf("requeststream call %s %s with %d body bytes, want POST /edge/server/requeststream?id=%s and no body",
				c.r.Method, c.r.URL, len(c.body), id)
		}
		checkCredentials(t, c.r, cfg.Token)
		return c
	}
	// echo reads chunks until want arrived, or the end when toEOF.
	echo := func(want string, toEOF bool) {
		t.Helper()
		var got string
		for {
			m, _ := f.nextChunk(t, http.StatusOK)
			if m.HasStatus || m.ID != id {
				t.Fatalf("chunk %+v", m)
			}
			got += string(m.Body)
			if m.EOF {
				if !toEOF {
					t.Fatalf("the response ended after %q", got)
				}
				if len(header(m.Trailer, wire.AbortTrailer)) > 0 {
					t.Errorf("a clean close carries %s: %v", wire.AbortTrailer, m.Trailer)
				}
				break
			}
			if !toEOF && len(got) >= len(want) {
				break
			}
		}
		if got != want {
			t.Fatalf("device bytes %q, want %q", got, want)
		}
	}

	stream().reply <- answer{status: http.StatusOK, ctype: "application/octet-data", body: []byte("hello\n")}
	echo("echo: hello\n", false)
	stream().reply <- answer{status: http.StatusOK, ctype: "application/octet-data"} // nothing within the wait: loop
	stream().reply <- answer{status: http.StatusOK, ctype: "application/octet-data", body: []byte("bye\n")}
	// The backend answers and closes the connection: that ends the response.
	echo("echo: bye\n", true)
	select {
	case <-backendDone:
	case <-time.After(wait):
		t.Fatal("the backend connection was not closed")
	}
}

func TestBackendDown(t *testing.T) {
	f := newFakeRelay(t)
	runAgent(t, config(t, f, "http://"+deadPort(t)))
	f.hand(t, &wire.Request{ID: newID(2), Method: http.MethodGet, URL: "http://invalid/"})
	m, _ := f.nextChunk(t, http.StatusOK)
	if !m.HasStatus || m.StatusCode != http.StatusBadGateway || !m.EOF || !strings.HasPrefix(string(m.Body), "Backend request failed") {
		t.Fatalf("chunk %+v, want one 502 chunk saying \"Backend request failed\"", m)
	}
	if got := header(m.Header, "Content-Type"); len(got) != 1 || !strings.HasPrefix(got[0], "text/plain") {
		t.Errorf("Content-Type %q", got)
	}
}

func TestBadRequestForBackend(t *testing.T) {
	f := newFakeRelay(t)
	b := backend(t, hello)
	runAgent(t, config(t, f, b.URL))
	f.hand(t, &wire.Request{ID: newID(6), Method: "GET", URL: "http://invalid/%zz"})
	m, _ := f.nextChunk(t, http.StatusOK)
	if !m.HasStatus || m.StatusCode != http.StatusBadRequest || !m.EOF || !strings.Contains(string(m.Body), "Bad request") {
		t.Fatalf("chunk %+v, want a 400 saying why", m)
	}
}

// TestEmptyPollAnswerIsNotARequest: a 200 without a request (an empty body
// from a proxy on the way) makes the agent poll again, without calling the
// backend or posting an answer to nobody.
func TestEmptyPollAnswerIsNotARequest(t *testing.T) {
	f := newFakeRelay(t)
	var backendCalls atomic.Int32
	b := backend(t, func(w http.ResponseWriter, r *http.Request) {
		backendCalls.Add(1)
		hello(w, r)
	})
	runAgent(t, config(t, f, b.URL))
	f.nextPoll(t).answer(http.StatusOK, "")
	f.hand(t, &wire.Request{ID: newID(1), Method: http.MethodGet, URL: "http://invalid/"})
	m, _ := f.nextChunk(t, http.StatusOK)
	if m.ID != newID(1) {
		t.Fatalf("the first answer posted is for %q, want %q", m.ID, newID(1))
	}
	if n := backendCalls.Load(); n != 1 {
		t.Fatalf("the backend was called %d times, want once: the empty answer is no request", n)
	}
}

// TestUpgradeFollowsTheAgentsOtherRelays: when the relay an upgraded
// request came through goes away (it stopped, in a rolling update), the
// agent fetches the user's bytes and posts the device's through its other
// relays, which pass them on; the session goes on.
func TestUpgradeFollowsTheAgentsOtherRelays(t *testing.T) {
	b, _ := echoLinesBackend(t)
	first, second := newFakeRelay(t), newFakeRelay(t)
	cfg := config(t, first, b.URL)
	cfg.Relays = append(cfg.Relays, mustURL(t, second.srv.URL))
	runAgent(t, cfg)
	id := newID(7)
	first.hand(t, upgradeRequest(id))
	if head, _ := first.nextChunk(t, http.StatusOK); head.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("first chunk %+v, want a 101 head", head)
	}
	next(t, first.streams, "requeststream call").reply <- answer{status: http.StatusOK, ctype: "application/octet-data", body: []byte("hello\n")}
	if m, _ := first.nextChunk(t, http.StatusOK); string(m.Body) != "echo: hello\n" {
		t.Fatalf("chunk %q", m.Body)
	}

	// The first relay goes away as a stopping relay does: it answers the
	// call in flight, closes its connections and listens no more.
	c := next(t, first.streams, "requeststream call")
	first.srv.Config.SetKeepAlivesEnabled(false)
	first.srv.Listener.Close()
	c.reply <- answer{status: http.StatusOK, ctype: "application/octet-data"} // nothing within the wait
	next(t, second.streams, "requeststream call through the other relay").reply <- answer{status: http.StatusOK, ctype: "application/octet-data", body: []byte("bye\n")}
	var got string
	for {
		m, _ := second.nextChunk(t, http.StatusOK)
		if m.ID != id {
			t.Fatalf("chunk for %q, want %q", m.ID, id)
		}
		got += string(m.Body)
		if m.EOF {
			break
		}
	}
	if got != "echo: bye\n" {
		t.Fatalf("device bytes through the other relay %q, want the echo of bye", got)
	}
}

// TestEmptyStreamBodyIsPresent: over HTTP/2, a request whose protocol has a
// body (gRPC, or anything asking for trailers) goes to the backend with a
// body that is empty but present, ended by an empty DATA frame; a plain
// request without a body ends its stream on the HEADERS frame. A backend
// sees the difference as an unknown length (-1) against a length of 0.
func TestEmptyStreamBodyIsPresent(t *testing.T) {
	type seen struct {
		proto         int
		contentLength int64
	}
	got := make(chan seen, 1)
	b := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got <- seen{r.ProtoMajor, r.ContentLength}
	}))
	b.Config.Protocols = new(http.Protocols)
	b.Config.Protocols.SetUnencryptedHTTP2(true)
	b.Start()
	t.Cleanup(b.Close)
	f := newFakeRelay(t)
	cfg := config(t, f, b.URL)
	cfg.BackendH2C = true
	runAgent(t, cfg)

	tests := []struct {
		name   string
		method string
		header []wire.Header
		want   int64
	}{
		{"gRPC", http.MethodPost, []wire.Header{{Name: "Content-Type", Value: "application/grpc"}, {Name: "Te", Value: "trailers"}}, -1},
		{"gRPC with a subtype", http.MethodPost, []wire.Header{{Name: "Content-Type", Value: "application/grpc+proto"}}, -1},
		{"asks for trailers", http.MethodPost, []wire.Header{{Name: "Te", Value: "trailers"}}, -1},
		{"plain POST", http.MethodPost, []wire.Header{{Name: "Content-Type", Value: "text/plain"}}, 0},
		{"GET", http.MethodGet, nil, 0},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.hand(t, &wire.Request{ID: newID(i + 1), Method: tt.method, URL: "http://invalid/grpc.testing.TestService/StreamingInputCall", Header: tt.header})
			select {
			case s := <-got:
				if s.proto != 2 || s.contentLength != tt.want {
					t.Errorf("backend saw HTTP/%d with length %d, want HTTP/2 with %d", s.proto, s.contentLength, tt.want)
				}
			case <-time.After(wait):
				t.Fatal("the backend got no request")
			}
			f.nextChunk(t, http.StatusOK)
		})
	}
}
