package fleettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// Limits of the relay in TestAbuse.
const (
	abuseStreams       = 2                      // --max-streams-per-agent and --max-streams-per-device
	abuseIdle          = 800 * time.Millisecond // --idle-stream-timeout
	abuseHeaderTimeout = 300 * time.Millisecond // the listeners' ReadHeaderTimeout
	abusePollWait      = 3 * abuseIdle          // long polls wait past the idle timeout
)

// abuseEnv is what TestAbuse runs against: a relay with small limits, a
// native agent for "abuse" and a long-poll agent for "lp", both in front of
// abuseBackend.
type abuseEnv struct {
	relay   *Relay
	backend *abuseBackend
	user    string // a user token for every device
	agentLP string // the agent token for "lp"
	client  *http.Client
	h2      *http.Client // HTTP/2 with prior knowledge
}

// abuseBackend is the device's service: it reports what reached it.
type abuseBackend struct {
	entered   chan struct{} // a /hold request arrived
	release   chan struct{} // closed to end the /hold requests
	cancelled chan error    // a /big response ended: how
}

func (b *abuseBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/echo":
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "got %d bytes\n", n)
	case "/hold":
		b.entered <- struct{}{}
		select {
		case <-b.release:
			io.WriteString(w, "released\n")
		case <-r.Context().Done():
		}
	case "/big":
		chunk := []byte(strings.Repeat("big!", 8<<10))
		for {
			if _, err := w.Write(chunk); err != nil {
				b.cancelled <- err
				return
			}
		}
	case "/follow":
		// A device that thinks, then streams a line now and then, each
		// time quiet for longer than the idle timeout: the relay waits on
		// it, never on the user.
		rc := http.NewResponseController(w)
		for i := range 3 {
			select {
			case <-time.After(abuseIdle * 5 / 4):
			case <-r.Context().Done():
				return
			}
			fmt.Fprintf(w, "line %d\n", i)
			rc.Flush()
		}
	default:
		http.NotFound(w, r)
	}
}

func newAbuseEnv(t *testing.T) *abuseEnv {
	t.Helper()
	b := &abuseBackend{entered: make(chan struct{}, 16), release: make(chan struct{}), cancelled: make(chan error, 16)}
	backend := httptest.NewServer(b)
	t.Cleanup(backend.Close)
	t.Cleanup(func() { close(b.release) }) // before the backend closes

	e := &abuseEnv{backend: b, client: NewClient(t, true)}
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(h2.CloseIdleConnections)
	e.h2 = &http.Client{Transport: h2, Timeout: 30 * time.Second}

	e.relay = StartRelay(t, func(c *node.Config) {
		c.MaxStreamsPerAgent = abuseStreams
		c.MaxStreamsPerDevice = abuseStreams
		c.IdleStreamTimeout = abuseIdle
		c.ReadHeaderTimeout = abuseHeaderTimeout
		c.Broker.PollWait = abusePollWait
	})
	r := e.relay
	e.user = r.Token(t, auth.KindUser, "alice")
	e.agentLP = r.Token(t, auth.KindAgent, "lp agent", "lp")
	StartAgent(t, r, "abuse", backend.URL, r.Token(t, auth.KindAgent, "abuse agent", "abuse"))
	StartAgent(t, r, "lp", backend.URL, e.agentLP, func(c *agent.Config) { c.Protocol = agent.ProtocolLongPoll })
	r.WaitDevice(t, "abuse")
	r.WaitDevice(t, "lp")
	return e
}

// get sends a GET for path on device as the user.
func (e *abuseEnv) get(t *testing.T, device, path string) badResult {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.relay.URL+"/client/"+device+path, nil)
	req.Header.Set("X-Switchboard-Token", e.user)
	return (&badEnv{client: e.client}).send(t, req)
}

// metric reads a value of the relay's /metrics.
func (e *abuseEnv) metric(name string) (float64, error) {
	code, body, err := fetch(e.client, e.relay.AdminURL+"/metrics")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("/metrics: %d %v", code, err)
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}

func fetch(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// atCap holds as many requests on the native agent as it may take, then
// sends one more.
func (e *abuseEnv) atCap(t *testing.T) badResult {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel() // the held requests end: the backend sees their contexts end
		wg.Wait()
	}()
	for range abuseStreams {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.relay.URL+"/client/abuse/hold", nil)
			req.Header.Set("X-Switchboard-Token", e.user)
			if resp, err := e.client.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	for i := range abuseStreams {
		select {
		case <-e.backend.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("the backend holds %d requests of %d", i, abuseStreams)
		}
	}
	return e.get(t, "abuse", "/echo")
}

// rawRelay opens a connection to the relay's public listener; it closes
// when the test ends.
func (e *abuseEnv) rawRelay(t *testing.T) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.relay.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// stalledBody sends the head of a body on HTTP/1.1 and then nothing, reads
// the answer, and checks that the relay closes the connection after it.
func (e *abuseEnv) stalledBody(t *testing.T, path string, token bool) badResult {
	t.Helper()
	conn := e.rawRelay(t)
	head := "POST " + path + " HTTP/1.1\r\nHost: relay.example\r\nContent-Length: 1000\r\n"
	if token {
		head += "X-Switchboard-Token: " + e.user + "\r\n"
	}
	io.WriteString(conn, head+"\r\nthe first bytes, then nothing")
	conn.SetReadDeadline(time.Now().Add(abuseIdle + 10*time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	res := badResult{status: resp.StatusCode, header: resp.Header, body: string(body)}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Errorf("after the answer: %v, want the connection closed (the rest of the body is still on it)", err)
	}
	return res
}

// stalledBodyH2 does the same over HTTP/2: the stream, not the connection,
// carries the body.
func (e *abuseEnv) stalledBodyH2(t *testing.T) badResult {
	t.Helper()
	pr, pw := io.Pipe()
	defer pw.Close()
	go io.WriteString(pw, "the first bytes, then nothing")
	req, _ := http.NewRequest(http.MethodPost, e.relay.URL+"/client/abuse/echo", pr)
	req.Header.Set("X-Switchboard-Token", e.user)
	resp, err := e.h2.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 {
		t.Errorf("the answer came over %s, want HTTP/2", resp.Proto)
	}
	return badResult{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

// steadyBody streams a body for 3·timeout, a chunk every timeout/8.
func (e *abuseEnv) steadyBody(t *testing.T, c *http.Client) badResult {
	t.Helper()
	pr, pw := io.Pipe()
	go func() {
		tick := time.NewTicker(abuseIdle / 8)
		defer tick.Stop()
		for range 24 {
			<-tick.C
			if _, err := io.WriteString(pw, "0123456789"); err != nil {
				return
			}
		}
		pw.Close()
	}()
	defer pr.Close()
	req, _ := http.NewRequest(http.MethodPost, e.relay.URL+"/client/abuse/echo", pr)
	req.Header.Set("X-Switchboard-Token", e.user)
	return (&badEnv{client: c}).send(t, req)
}

// unreadResponse asks for an endless response and reads none of it. The
// relay must cut the user off and cancel the device's request.
func (e *abuseEnv) unreadResponse(t *testing.T) badResult {
	t.Helper()
	conn := e.rawRelay(t)
	io.WriteString(conn, "GET /client/abuse/big HTTP/1.1\r\nHost: relay.example\r\nX-Switchboard-Token: "+e.user+"\r\n\r\n")
	start := time.Now()
	select {
	case err := <-e.backend.cancelled:
		took := time.Since(start)
		if took < abuseIdle {
			t.Errorf("the backend's response ended after %v, before the idle timeout", took)
		}
		t.Logf("the backend's response ended after %v: %v", took.Round(time.Millisecond), err)
	case <-time.After(abuseIdle + 15*time.Second):
		t.Fatal("the backend still answers a user who reads nothing")
	}
	// What the buffers held, then the end of the connection.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil && !isReset(err) {
		t.Errorf("reading what was buffered: %v, want the connection closed", err)
	}
	return badResult{closed: true}
}

// headerTrickle sends a header block to addr a byte at a time, for longer
// than any header timeout, until the listener hangs up. net/http may write
// "400 Bad Request" as it does (it does when the request line is still
// incomplete); that counts as hanging up.
func headerTrickle(t *testing.T, addr string) badResult {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		line := "GET /api/v1/tokens HTTP/1.1\r\nHost: admin\r\nX-Slow: " + strings.Repeat("a", 4096)
		for i := range len(line) {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte{line[i]}); err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		<-trickled
	}()
	conn.SetReadDeadline(start.Add(abuseHeaderTimeout + 10*time.Second))
	got, err := io.ReadAll(conn)
	if err != nil && !isReset(err) {
		t.Fatalf("during the trickle the listener sent %q, then %v; want the connection closed", got, err)
	}
	if len(got) > 0 && !strings.HasPrefix(string(got), "HTTP/1.1 400 Bad Request\r\n") {
		t.Fatalf("during the trickle the listener sent %q; want at most a 400 as it hangs up", got)
	}
	return badResult{closed: true}
}

// TestAbuse sends what clients that hog a relay send, and checks that each
// gets the exact status with a message that says what is wrong (or has its
// connection closed, where no status can reach it), and that the relay
// serves a good request right after with nothing left in flight.
func TestAbuse(t *testing.T) {
	t.Parallel()
	e := newAbuseEnv(t)
	r := e.relay
	lpPoll := func(t *testing.T) badResult {
		req, _ := http.NewRequest(http.MethodGet, r.URL+"/server/request?server=lp", nil)
		req.Header.Set("Authorization", "Bearer "+e.agentLP)
		return (&badEnv{client: e.client}).send(t, req)
	}

	tests := []struct {
		name       string
		send       func(t *testing.T) badResult
		status     int      // 0: the relay closes the connection without an answer
		words      []string // the body mentions each (case-insensitive)
		body       string   // the exact body, for answers from the device
		retryAfter bool
		atLeast    time.Duration // the answer comes no sooner
		within     time.Duration // the answer comes within; 0 means 10 s
	}{
		{name: "native agent at its stream cap", status: 503, retryAfter: true,
			words: []string{`device "abuse" is busy`, "it has 2 requests in flight", "try again shortly"},
			send:  e.atCap},
		{name: "body stalls (HTTP/1.1)", status: 408, atLeast: abuseIdle, within: abuseIdle + 10*time.Second,
			words: []string{"no byte of the request body arrived for " + abuseIdle.String()},
			send:  func(t *testing.T) badResult { return e.stalledBody(t, "/client/abuse/echo", true) }},
		{name: "body stalls (HTTP/2)", status: 408, atLeast: abuseIdle, within: abuseIdle + 10*time.Second,
			words: []string{"no byte of the request body arrived for " + abuseIdle.String()},
			send:  e.stalledBodyH2},
		{name: "body stalls on a request refused for want of a token", status: 401, atLeast: abuseIdle - 50*time.Millisecond,
			within: 2*abuseIdle + 10*time.Second, words: []string{"user token"},
			send: func(t *testing.T) badResult { return e.stalledBody(t, "/client/abuse/echo", false) }},
		{name: "body streams steadily for 3× the timeout (HTTP/1.1)", status: 200, body: "got 240 bytes\n", atLeast: 2 * abuseIdle,
			send: func(t *testing.T) badResult { return e.steadyBody(t, e.client) }},
		{name: "body streams steadily for 3× the timeout (HTTP/2)", status: 200, body: "got 240 bytes\n", atLeast: 2 * abuseIdle,
			send: func(t *testing.T) badResult { return e.steadyBody(t, e.h2) }},
		{name: "device quiet for longer than the timeout, then streaming", status: 200, atLeast: 3 * abuseIdle,
			body: "line 0\nline 1\nline 2\n",
			send: func(t *testing.T) badResult { return e.get(t, "abuse", "/follow") }},
		{name: "client never reads a large response", status: 0, atLeast: abuseIdle, within: abuseIdle + 25*time.Second,
			send: e.unreadResponse},
		{name: "long poll waits past the timeout", status: 408, atLeast: abusePollWait, within: abusePollWait + 10*time.Second,
			words: []string{"no request for this device within the poll wait"},
			send:  lpPoll},
		{name: "header trickle on the admin listener", status: 0, atLeast: abuseHeaderTimeout - 50*time.Millisecond,
			within: abuseHeaderTimeout + 10*time.Second,
			send:   func(t *testing.T) badResult { return headerTrickle(t, strings.TrimPrefix(r.AdminURL, "http://")) }},
		{name: "header trickle on the public listener", status: 0, atLeast: abuseHeaderTimeout - 50*time.Millisecond,
			within: abuseHeaderTimeout + 10*time.Second,
			send:   func(t *testing.T) badResult { return headerTrickle(t, strings.TrimPrefix(r.URL, "http://")) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			within := tt.within
			if within == 0 {
				within = 10 * time.Second
			}
			start := time.Now()
			res := tt.send(t)
			took := time.Since(start)
			if took > within || took < tt.atLeast {
				t.Errorf("answered after %v, want between %v and %v", took, tt.atLeast, within)
			}
			switch {
			case tt.status == 0 && !res.closed:
				t.Errorf("got %d %q, want the connection closed without an answer", res.status, res.body)
			case tt.status != 0 && res.closed:
				t.Errorf("the relay closed the connection, want %d", tt.status)
			case tt.status != 0 && res.status != tt.status:
				t.Errorf("got %d %q, want %d", res.status, strings.TrimSpace(res.body), tt.status)
			case tt.body != "" && res.body != tt.body:
				t.Errorf("body %q, want %q", res.body, tt.body)
			case tt.status != 0 && tt.body == "":
				checkReadable(t, res, tt.words)
			}
			if tt.retryAfter {
				if n, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || n < 1 {
					t.Errorf("Retry-After %q, want whole seconds", res.header.Get("Retry-After"))
				}
			}
			Eventually(t, 10*time.Second, func() error {
				if n, err := e.metric("switchboard_tunnel_requests_in_flight"); err != nil || n != 0 {
					return fmt.Errorf("%v requests in flight on the native agent (%v), want none", n, err)
				}
				return nil
			})
			for _, device := range []string{"abuse", "lp"} {
				if good := e.get(t, device, "/echo"); good.status != http.StatusOK || good.body != "got 0 bytes\n" {
					t.Errorf("a good request to %s afterwards got %d %q", device, good.status, good.body)
				}
			}
		})
	}
}
