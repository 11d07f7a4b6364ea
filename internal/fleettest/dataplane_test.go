package fleettest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// protocolNativeV1 is the native protocol offering the tunnel's first
// version alone, as an agent from before version 2 does.
const protocolNativeV1 = "native-v1"

// protocols are the agent protocols every data-plane test runs with: the
// long-poll protocol, the native tunnel (version 2) and its version 1.
var protocols = []string{agent.ProtocolLongPoll, agent.ProtocolNative, protocolNativeV1}

// forEachProtocol runs f as a subtest per agent protocol.
func forEachProtocol(t *testing.T, f func(t *testing.T, proto string)) {
	for _, p := range protocols {
		t.Run(p, func(t *testing.T) { f(t, p) })
	}
}

// protocol sets the agent's protocol, one of protocols.
func protocol(p string) func(*agent.Config) {
	return func(c *agent.Config) {
		if p == protocolNativeV1 {
			c.Protocol, c.TunnelVersion = agent.ProtocolNative, tunnel.V1
			return
		}
		c.Protocol = p
	}
}

// isNative reports whether p, one of protocols, is a native tunnel.
func isNative(p string) bool { return p != agent.ProtocolLongPoll }

// setup starts a relay, a backend and an agent speaking proto for device
// "dev", and returns the relay, the backend and a user token for "dev".
func setup(t *testing.T, proto string) (*Relay, *testBackend, string) {
	t.Helper()
	r := StartRelay(t)
	b := newBackend(t, "b1")
	StartAgent(t, r, "dev", b.URL, r.Token(t, auth.KindAgent, "dev agent", "dev"), protocol(proto))
	r.WaitDevice(t, "dev")
	return r, b, r.Token(t, auth.KindUser, "alice", "dev")
}

// do sends a request with the user token and returns the response.
func do(t *testing.T, method, url, token string, body io.Reader, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decodeEcho(t *testing.T, resp *http.Response) echoReply {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %s: %s", resp.Status, b)
	}
	var e echoReply
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("decode echo: %v", err)
	}
	return e
}

func TestMethodsAndBodies(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r, _, user := setup(t, proto)
		tests := []struct {
			method, body string
		}{
			{http.MethodGet, ""},
			{http.MethodPost, `{"hello":"world"}`},
			{http.MethodPut, strings.Repeat("x", 200_000)},
			{http.MethodDelete, ""},
			{http.MethodPatch, "patch"},
		}
		for _, tt := range tests {
			t.Run(tt.method, func(t *testing.T) {
				resp := do(t, tt.method, r.URL+"/client/dev/echo/a%2Fb/c?x=1&y=two", user, strings.NewReader(tt.body), "X-Custom", "kept")
				e := decodeEcho(t, resp)
				if e.Method != tt.method || e.Body != tt.body {
					t.Fatalf("backend saw %s with %d body bytes, want %s with %d", e.Method, len(e.Body), tt.method, len(tt.body))
				}
				if e.Path != "/echo/a/b/c" || e.RawPath != "/echo/a%2Fb/c" || e.Query != "x=1&y=two" {
					t.Fatalf("backend saw path %q raw %q query %q", e.Path, e.RawPath, e.Query)
				}
				if got := e.Header.Get("X-Custom"); got != "kept" {
					t.Fatalf("X-Custom = %q, want kept", got)
				}
				if got := e.Header.Get("Authorization"); got != "" {
					t.Fatalf("the user's relay token reached the device: Authorization = %q", got)
				}
				if !strings.HasPrefix(e.Host, "127.0.0.1:") {
					t.Fatalf("backend saw Host %q, want the user's", e.Host)
				}
			})
		}
	})
}

func TestHeaderAddressing(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r, _, user := setup(t, proto)
		resp := do(t, http.MethodGet, r.URL+"/echo/by-header", user, nil, "X-Server-Name", "dev")
		if e := decodeEcho(t, resp); e.Path != "/echo/by-header" {
			t.Fatalf("path = %q", e.Path)
		}
		// The relay's own paths are never forwarded in header mode.
		resp = do(t, http.MethodGet, r.URL+"/healthz", "", nil, "X-Server-Name", "dev")
		if b, _ := io.ReadAll(resp.Body); strings.TrimSpace(string(b)) != "ok" {
			t.Fatalf("/healthz with X-Server-Name answered %q", b)
		}
	})
}

func TestChunkedUpload(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r, _, user := setup(t, proto)
		pr, pw := io.Pipe()
		go func() {
			for i := 0; i < 100; i++ {
				io.WriteString(pw, "0123456789")
			}
			pw.Close()
		}()
		resp := do(t, http.MethodPost, r.URL+"/client/dev/echo/upload", user, pr)
		e := decodeEcho(t, resp)
		if len(e.Body) != 1000 {
			t.Fatalf("backend got %d bytes, want 1000", len(e.Body))
		}
	})
}

func TestStreamedResponse(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r, b, user := setup(t, proto)
		for _, ct := range []string{"text/event-stream", "text/plain"} {
			resp := do(t, http.MethodGet, r.URL+"/client/dev/sse?type="+ct, user, nil)
			if got := resp.Header.Get("Content-Type"); got != ct {
				t.Fatalf("Content-Type = %q, want %q", got, ct)
			}
			rd := bufio.NewReader(resp.Body)
			for i := 1; i <= 3; i++ {
				b.sseGo <- struct{}{} // the backend writes event i only now
				line, err := rd.ReadString('\n')
				if err != nil {
					t.Fatalf("%s: event %d: %v", ct, i, err)
				}
				if want := "data: event " + string(rune('0'+i)) + "\n"; line != want {
					t.Fatalf("%s: event %d: got %q, want %q", ct, i, line, want)
				}
				rd.ReadString('\n') // the blank line ending the event
			}
			resp.Body.Close()
		}
	})
}

func TestTrailers(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r, _, user := setup(t, proto)
		resp := do(t, http.MethodGet, r.URL+"/client/dev/trailers", user, nil)
		body, err := io.ReadAll(resp.Body)
		if err != nil || string(body) != "body before trailers" {
			t.Fatalf("body %q, err %v", body, err)
		}
		if got := resp.Trailer.Get("X-Checksum"); got != "abc123" {
			t.Fatalf("declared trailer X-Checksum = %q, want abc123 (trailers %v)", got, resp.Trailer)
		}
		if got := resp.Trailer.Get("X-Late"); got != "undeclared" {
			t.Fatalf("undeclared trailer X-Late = %q, want undeclared (trailers %v)", got, resp.Trailer)
		}
	})
}

func TestWebSocketEcho(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r, _, user := setup(t, proto)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(r.URL, "http")+"/client/dev/ws", &websocket.DialOptions{
			HTTPHeader: http.Header{"Authorization": {"Bearer " + user}},
		})
		if err != nil {
			t.Fatalf("dial websocket through the relay: %v", err)
		}
		defer c.CloseNow()
		for i, msg := range []string{"hello", strings.Repeat("big", 10000), "bye"} {
			if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			_, got, err := c.Read(ctx)
			if err != nil || string(got) != msg {
				t.Fatalf("echo %d: got %d bytes, err %v", i, len(got), err)
			}
		}
		if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Fatalf("close: %v", err)
		}
	})
}

func TestRawUpgradeEcho(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r, _, user := setup(t, proto)
		conn, err := net.Dial("tcp", strings.TrimPrefix(r.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(conn, "POST /client/dev/raw-upgrade HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer "+user+
			"\r\nConnection: Upgrade\r\nUpgrade: echo-lines\r\nContent-Length: 0\r\n\r\n")
		rd := bufio.NewReader(conn)
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatalf("read 101: %v", err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %s: %s", resp.Status, b)
		}
		for _, line := range []string{"ls -l", "whoami", strings.Repeat("z", 30000)} {
			io.WriteString(conn, line+"\n")
			got, err := rd.ReadString('\n')
			if err != nil || got != "echo: "+line+"\n" {
				t.Fatalf("echo of %d bytes: got %d bytes, err %v", len(line), len(got), err)
			}
		}
	})
}

func TestTwoAgentsShareADevice(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r := StartRelay(t)
		b1, b2 := newBackend(t, "b1"), newBackend(t, "b2")
		tok := r.Token(t, auth.KindAgent, "dev agents", "dev")
		StartAgent(t, r, "dev", b1.URL, tok, protocol(proto))
		StartAgent(t, r, "dev", b2.URL, tok, protocol(proto))
		r.WaitDevice(t, "dev")
		user := r.Token(t, auth.KindUser, "alice")
		// The device is up once one agent is; the other may connect a
		// little later, so requests go on until both have served, or 10 s.
		seen := map[string]bool{}
		n := int64(0)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && (!seen["b1"] || !seen["b2"] || n < 60); n++ {
			resp := do(t, http.MethodGet, r.URL+"/client/dev/echo/", user, nil)
			seen[decodeEcho(t, resp).Backend] = true
			resp.Body.Close()
		}
		if !seen["b1"] || !seen["b2"] {
			t.Fatalf("%d requests reached only %v; both agents should serve", n, seen)
		}
		if got := b1.hits.Load() + b2.hits.Load(); got != n {
			t.Fatalf("backends saw %d requests, want exactly %d (each request to exactly one agent)", got, n)
		}
	})
}

func TestAgentKilledMidStream(t *testing.T) {
	t.Parallel()
	forEachProtocol(t, func(t *testing.T, proto string) {
		r := StartRelay(t)
		b := newBackend(t, "b1")
		ag := StartAgent(t, r, "dev", b.URL, r.Token(t, auth.KindAgent, "dev agent", "dev"), protocol(proto))
		r.WaitDevice(t, "dev")
		user := r.Token(t, auth.KindUser, "alice")
		resp := do(t, http.MethodGet, r.URL+"/client/dev/stream-forever", user, nil)
		rd := bufio.NewReader(resp.Body)
		for i := 0; i < 5; i++ {
			if _, err := rd.ReadString('\n'); err != nil {
				t.Fatalf("line %d: %v", i, err)
			}
		}
		ag.Stop()
		done := make(chan error, 1)
		go func() {
			_, err := io.Copy(io.Discard, rd)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("the response ended cleanly although the agent died mid-stream; want an error")
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Logf("user saw: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the user was left hanging after the agent died")
		}
	})
}

func TestNoAgentAnswersAtOnce(t *testing.T) {
	r := StartRelay(t)
	user := r.Token(t, auth.KindUser, "alice")
	start := time.Now()
	resp := do(t, http.MethodGet, r.URL+"/client/ghost/", user, nil)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"ghost"`) {
		t.Fatalf("got %s %q, want 503 naming the device", resp.Status, body)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a device never seen took %v to answer", took)
	}
}

func TestDeviceWhoseAgentLeftAnswersAfterGrace(t *testing.T) {
	t.Parallel()
	forEachProtocol(t, func(t *testing.T, proto string) {
		r := StartRelay(t)
		b := newBackend(t, "b1")
		ag := StartAgent(t, r, "dev", b.URL, r.Token(t, auth.KindAgent, "dev agent", "dev"), protocol(proto))
		r.WaitDevice(t, "dev")
		ag.Stop()
		user := r.Token(t, auth.KindUser, "alice")
		resp := do(t, http.MethodGet, r.URL+"/client/dev/echo/", user, nil)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"dev"`) {
			t.Fatalf("got %s %q, want 503 naming the device", resp.Status, body)
		}
		if resp.Header.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
	})
}

func TestUnauthorized(t *testing.T) {
	r := StartRelay(t)
	b := newBackend(t, "b1")

	forEachProtocol(t, func(t *testing.T, proto string) {
		t.Run("agent without token", func(t *testing.T) {
			ag := StartAgent(t, r, "dev", b.URL, "", protocol(proto))
			<-ag.Done()
			if !errors.Is(ag.Err(), agent.ErrUnauthorized) {
				t.Fatalf("agent ended with %v, want ErrUnauthorized", ag.Err())
			}
		})
		t.Run("agent token for another device", func(t *testing.T) {
			ag := StartAgent(t, r, "dev", b.URL, r.Token(t, auth.KindAgent, "other", "other"), protocol(proto))
			<-ag.Done()
			if !errors.Is(ag.Err(), agent.ErrUnauthorized) {
				t.Fatalf("agent ended with %v, want ErrUnauthorized", ag.Err())
			}
		})
	})

	StartAgent(t, r, "dev", b.URL, r.Token(t, auth.KindAgent, "dev", "dev"))
	r.WaitDevice(t, "dev")
	users := []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"forged token", "sbu_0123abcd_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", http.StatusUnauthorized},
		{"token for another device", r.Token(t, auth.KindUser, "bob", "other"), http.StatusForbidden},
		{"agent token", r.Token(t, auth.KindAgent, "dev2", "dev"), http.StatusForbidden},
		{"user token", r.Token(t, auth.KindUser, "carol", "dev"), http.StatusOK},
	}
	for _, u := range users {
		t.Run("user "+u.name, func(t *testing.T) {
			resp := do(t, http.MethodGet, r.URL+"/client/dev/echo/", "", nil, "X-Switchboard-Token", u.token)
			if resp.StatusCode != u.want {
				t.Fatalf("got %s, want %d", resp.Status, u.want)
			}
			if b.hits.Load() > 1 {
				t.Fatalf("a refused user reached the backend")
			}
		})
	}
}
