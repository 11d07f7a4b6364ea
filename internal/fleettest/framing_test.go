package fleettest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
)

// framingEnv is a fleet of two relays with a device behind each agent
// protocol, each reachable directly (at its holder) and forwarded.
type framingEnv struct {
	holder, other map[string]*Relay // by device
	user          string
}

var framingDevices = map[string]string{"nat": agent.ProtocolNative, "lp": agent.ProtocolLongPoll}

func newFramingEnv(t *testing.T) *framingEnv {
	t.Helper()
	relays := StartFleet(t, 2)
	b := newBackend(t, "b1")
	e := &framingEnv{holder: map[string]*Relay{}, other: map[string]*Relay{}}
	for dev, proto := range framingDevices {
		holder, others := HolderFor(t, relays, dev)
		StartAgent(t, holder, dev, b.URL, holder.Token(t, auth.KindAgent, dev+" agent", dev), protocol(proto))
		waitHolder(t, relays, dev, holder)
		e.holder[dev], e.other[dev] = holder, others[0]
	}
	e.user = FleetToken(t, relays, auth.KindUser, "alice", "nat", "lp")
	return e
}

// forEach runs f for each device, sent to its holder and forwarded.
func (e *framingEnv) forEach(t *testing.T, f func(t *testing.T, r *Relay, dev string)) {
	for dev := range framingDevices {
		t.Run(dev+"/direct", func(t *testing.T) { f(t, e.holder[dev], dev) })
		t.Run(dev+"/forwarded", func(t *testing.T) { f(t, e.other[dev], dev) })
	}
}

// rawConn is a client connection written by hand.
type rawConn struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func dialRaw(t *testing.T, r *Relay) *rawConn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, conn: conn, br: bufio.NewReader(conn)}
}

// roundTrip writes text and reads one response whole.
func (c *rawConn) roundTrip(text string) (*http.Response, string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, text); err != nil {
		c.t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("read response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

// closed reports whether the relay closed the connection after its
// answer (rather than keeping it for another request: then the read waits
// for the connection's deadline).
func (c *rawConn) closed() bool {
	_, err := c.br.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

func post(dev, token, headers, body string) string {
	return "POST /client/" + dev + "/echo/x HTTP/1.1\r\nHost: relay.example\r\nX-Switchboard-Token: " + token + "\r\n" + headers + "\r\n" + body
}

// TestClientFramingErrors: a request body whose framing is broken is the
// user's fault, a 400 that says so, and its connection is closed; a
// request with both Content-Length and Transfer-Encoding is served and its
// connection closed (RFC 9112 §6.1); an ordinary one keeps its connection.
func TestClientFramingErrors(t *testing.T) {
	e := newFramingEnv(t)
	e.forEach(t, func(t *testing.T, r *Relay, dev string) {
		tests := []struct {
			name   string
			text   string
			status int
			words  []string
			closed bool
		}{
			{"bad chunk size", post(dev, e.user, "Transfer-Encoding: chunked\r\n", "zz\r\nhello\r\n0\r\n\r\n"),
				400, []string{"request body", "invalid byte in chunk length"}, true},
			{"bad chunk after a good one", post(dev, e.user, "Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n5x\r\nworld\r\n0\r\n\r\n"),
				400, []string{"request body", "chunk"}, true},
			{"Content-Length and Transfer-Encoding", post(dev, e.user, "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
				200, []string{`"Body":"hello"`}, true},
			{"chunked", post(dev, e.user, "Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
				200, []string{`"Body":"hello"`}, true},
			{"Content-Length", post(dev, e.user, "Content-Length: 5\r\n", "hello"),
				200, []string{`"Body":"hello"`}, false},
		}
		for _, tt := range tests {
			c := dialRaw(t, r)
			resp, body := c.roundTrip(tt.text)
			if resp.StatusCode != tt.status {
				t.Errorf("%s: status %d, want %d: %s", tt.name, resp.StatusCode, tt.status, body)
			}
			for _, w := range tt.words {
				if !strings.Contains(body, w) {
					t.Errorf("%s: body %q does not say %q", tt.name, body, w)
				}
			}
			if !tt.closed {
				// Kept open: it serves the next request.
				if resp, _ := c.roundTrip(post(dev, e.user, "Content-Length: 2\r\n", "ok")); resp.StatusCode != http.StatusOK {
					t.Errorf("%s: the next request on the connection got %s", tt.name, resp.Status)
				}
				continue
			}
			if !c.closed() {
				t.Errorf("%s: the connection stayed open (Connection: %q)", tt.name, resp.Header.Get("Connection"))
			}
		}
	})
}

// TestPathPolicy: paths some backend could take to climb above its prefix
// are refused with a 400 on every way in; legitimate escapes arrive as
// sent.
func TestPathPolicy(t *testing.T) {
	e := newFramingEnv(t)
	bad := []struct{ path, word string }{
		{"/echo/..;/secret", "'..'"},
		{"/echo/.;x=1/secret", "'..'"},
		{"/echo/%2e%2e/secret", "'..'"},
		{"/echo/%2E%2e%2fsecret", "'..'"},
		{"/echo/..%5csecret", "'..'"},
		{"/echo/..%5Csecret", "'..'"},
		{"/echo/..\\secret", "'..'"},
		{"/echo/%c0%ae%c0%ae/secret", "UTF-8"},
		{"/echo/%252e%252e/secret", "decoded twice"},
		{"/echo/secret%00.png", "%00"},
	}
	good := []struct{ path, wantPath, wantRaw string }{
		{"/echo/a%2Fb/c", "/echo/a/b/c", "/echo/a%2Fb/c"},
		{"/echo/a%20b", "/echo/a b", ""},
		{"/echo/api/v1/namespaces/default/pods/web-1/log", "/echo/api/v1/namespaces/default/pods/web-1/log", ""},
		{"/echo/grpc.health.v1.Health/Check", "/echo/grpc.health.v1.Health/Check", ""},
		{"/echo/caf%C3%A9", "/echo/café", ""},
		{"/echo/a;jsessionid=1", "/echo/a;jsessionid=1", ""},
		{"/echo/100%25", "/echo/100%", ""},
	}
	e.forEach(t, func(t *testing.T, r *Relay, dev string) {
		for _, header := range []bool{false, true} {
			target := func(p string) (string, []string) {
				if header {
					return p, []string{"X-Server-Name: " + dev}
				}
				return "/client/" + dev + p, nil
			}
			for _, tt := range bad {
				p, h := target(tt.path)
				res := rawGet(t, r, p, append(h, "X-Switchboard-Token: "+e.user)...)
				if res.status != http.StatusBadRequest || !strings.Contains(res.body, tt.word) {
					t.Errorf("header mode %v, %s: %d %q, want 400 saying %q", header, p, res.status, res.body, tt.word)
				}
			}
			for _, tt := range good {
				p, h := target(tt.path)
				res := rawGet(t, r, p, append(h, "X-Switchboard-Token: "+e.user)...)
				if res.status != http.StatusOK || !strings.Contains(res.body, `"Path":"`+tt.wantPath+`"`) || !strings.Contains(res.body, `"RawPath":"`+tt.wantRaw+`"`) {
					t.Errorf("header mode %v, %s: %d %s, want the path %q (raw %q)", header, p, res.status, res.body, tt.wantPath, tt.wantRaw)
				}
			}
		}
	})
}
