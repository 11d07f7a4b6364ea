package fleettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/cli"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// trusting makes an agent verify relays against ca.
func trusting(ca *CA) func(*agent.Config) {
	return func(c *agent.Config) { c.RootCAs = ca.Pool }
}

// send sends a request with the user token through c and returns the
// response, closed when the test ends.
func send(t *testing.T, c *http.Client, method, url, token string, body io.Reader) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// checkEchoOverTLS sends a POST to device's echo through the relay at base
// over HTTP/1.1 and over HTTP/2, and checks that each arrives and travels
// on the protocol asked for.
func checkEchoOverTLS(t *testing.T, ca *CA, base, device, user string) {
	t.Helper()
	for _, h2 := range []bool{false, true} {
		resp := send(t, ca.Client(t, h2), http.MethodPost, base+"/client/"+device+"/echo/x?h2="+strconv.FormatBool(h2), user, strings.NewReader("payload"))
		if want := map[bool]int{false: 1, true: 2}[h2]; resp.ProtoMajor != want {
			t.Errorf("asked for HTTP/%d, got %s", want, resp.Proto)
		}
		if e := decodeEcho(t, resp); e.Backend != "b1" || e.Body != "payload" || e.Path != "/echo/x" {
			t.Errorf("over %s: echo %+v", resp.Proto, e)
		}
	}
}

// checkWebSocketOverTLS opens a websocket (wss://) to device through the
// relay at base and checks that it echoes.
func checkWebSocketOverTLS(t *testing.T, ca *CA, base, device, user string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(base, "https")+"/client/"+device+"/ws", &websocket.DialOptions{
		HTTPClient: ca.Client(t, false),
		HTTPHeader: http.Header{"Authorization": {"Bearer " + user}},
	})
	if err != nil {
		t.Fatalf("websocket over TLS: %v", err)
	}
	defer c.CloseNow()
	for _, msg := range []string{"hello", strings.Repeat("x", 30000)} {
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("websocket echo: %d bytes, %v", len(got), err)
		}
	}
	if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// advertised returns the URL relay r advertises to the fleet.
func advertised(t *testing.T, r *Relay) string {
	t.Helper()
	var addr string
	Eventually(t, 10*time.Second, func() error {
		rs, err := r.Node.Fleet().Relay(r.Node.Fleet().ID())
		if err != nil {
			return err
		}
		if len(rs.Addresses) == 0 {
			return errNotYet
		}
		addr = rs.Addresses[0]
		return nil
	})
	return addr
}

func TestTLSRelay(t *testing.T) {
	ca := NewCA(t)
	r := StartTLSRelay(t, ca)
	if addr := advertised(t, r); addr != r.URL {
		t.Errorf("the relay advertises %q, want %q", addr, r.URL)
	}
	b := newBackend(t, "b1")
	forEachProtocol(t, func(t *testing.T, proto string) {
		device := "dev-" + proto
		StartAgent(t, r, device, b.URL, r.Token(t, auth.KindAgent, "agent", device), protocol(proto), trusting(ca))
		r.WaitDevice(t, device)
		if isNative(proto) && r.Node.TunnelSessions() != 1 {
			t.Fatalf("%d native tunnels over TLS, want 1", r.Node.TunnelSessions())
		}
		user := r.Token(t, auth.KindUser, "alice", device)
		checkEchoOverTLS(t, ca, r.URL, device, user)
		checkWebSocketOverTLS(t, ca, r.URL, device, user)
	})

	t.Run("native in a websocket", func(t *testing.T) {
		const device = "dev-ws"
		StartAgent(t, r, device, b.URL, r.Token(t, auth.KindAgent, "agent", device), trusting(ca),
			func(c *agent.Config) { c.WebSocket = true })
		r.WaitDevice(t, device)
		checkEchoOverTLS(t, ca, r.URL, device, r.Token(t, auth.KindUser, "alice", device))
	})

	t.Run("admin", func(t *testing.T) {
		c := ca.Client(t, true)
		if code, err := Status(c, r.AdminURL+control.PathHealthz); code != http.StatusOK {
			t.Fatalf("GET /healthz over TLS: %d, %v", code, err)
		}
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		resp, err := c.PostForm(r.AdminURL+control.PathAdminLogin, url.Values{"token": {r.AdminToken}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		cookies := resp.Cookies()
		if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 || !cookies[0].Secure || !cookies[0].HttpOnly {
			t.Errorf("sign-in over TLS: %s, cookies %v; want one Secure, HttpOnly cookie", resp.Status, cookies)
		}
	})

	t.Run("ctl", func(t *testing.T) {
		ctx := t.Context()
		if code, stdout, stderr := ctl(ctx, r, "--ca-file", ca.File, "relays", "list"); code != cli.ExitOK || !strings.Contains(stdout, r.Node.Fleet().ID()) {
			t.Errorf("ctl --ca-file: exit %d, %q, %q", code, stdout, stderr)
		}
		code, _, stderr := ctl(ctx, r, "relays", "list")
		if code != cli.ExitFailure || !strings.Contains(stderr, "certificate signed by unknown authority") || !strings.Contains(stderr, "pass --ca-file") {
			t.Errorf("ctl without --ca-file: exit %d, %q", code, stderr)
		}
	})
}

func TestTLSAgentWithoutCAFails(t *testing.T) {
	ca := NewCA(t)
	r := StartTLSRelay(t, ca)
	b := newBackend(t, "b1")
	forEachProtocol(t, func(t *testing.T, proto string) {
		device := "dev-" + proto
		logs := &testkit.Buffer{}
		StartAgent(t, r, device, b.URL, r.Token(t, auth.KindAgent, "agent", device), protocol(proto),
			func(c *agent.Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
		Eventually(t, 10*time.Second, func() error {
			if !strings.Contains(logs.String(), "certificate signed by unknown authority") {
				return fmt.Errorf("no certificate error logged yet: %q", logs)
			}
			return nil
		})
		if slices.Contains(r.Node.Devices(), device) {
			t.Errorf("an agent that does not trust the relay's certificate got connected")
		}
	})
}

// forwardsOK reads how many forwards relay r counted as answered.
func forwardsOK(t *testing.T, ca *CA, r *Relay) int {
	t.Helper()
	resp := send(t, ca.Client(t, false), http.MethodGet, r.AdminURL+control.PathMetrics, r.AdminToken, nil)
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^switchboard_router_forwards_total\{outcome="ok"\} (\d+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

func TestTLSForwardBetweenRelays(t *testing.T) {
	ca := NewCA(t)
	b := newBackend(t, "b1")
	forEachProtocol(t, func(t *testing.T, proto string) {
		// A fleet per protocol: the devices of the others would weigh on
		// where this one's is placed.
		relays := StartTLSFleet(t, 2, ca)
		for _, r := range relays {
			if addr := advertised(t, r); addr != r.URL {
				t.Fatalf("relay advertises %q, want %q", addr, r.URL)
			}
		}
		device := "dev-" + proto
		holder, others := HolderFor(t, relays, device)
		entry := others[0]
		// The agent dials the other relay: a native agent is sent on to the
		// holder, a long-poll agent's polls are forwarded there.
		StartAgent(t, entry, device, b.URL, FleetToken(t, relays, auth.KindAgent, "agent", device), protocol(proto), trusting(ca))
		waitHolder(t, relays, device, holder)
		user := FleetToken(t, relays, auth.KindUser, "alice", device)

		before := forwardsOK(t, ca, entry)
		checkEchoOverTLS(t, ca, entry.URL, device, user)
		checkWebSocketOverTLS(t, ca, entry.URL, device, user)
		if n := forwardsOK(t, ca, entry) - before; n != 3 {
			t.Errorf("the entry relay counted %d answered forwards, want 3 (HTTP/1.1, HTTP/2, websocket)", n)
		}
		if entry.Node.Vetoed(holder.Node.Fleet().ID()) {
			t.Errorf("the entry relay vetoed the holder: its probes over TLS failed")
		}
		// The relays hear each other over pulses, upgraded over TLS.
		Eventually(t, 10*time.Second, func() error {
			resp := send(t, ca.Client(t, false), http.MethodGet, entry.AdminURL+control.PathMetrics, entry.AdminToken, nil)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), "\nswitchboard_watchdog_pulses 1\n") {
				return errors.New("the entry relay has no pulse open with the holder")
			}
			return nil
		})
	})
}

func TestTLSPeerWithUntrustedCertificateIsVetoed(t *testing.T) {
	ca, other := NewCA(t), NewCA(t)
	relays := StartTLSFleet(t, 2, ca, func(c *node.Config) { c.PeerCAFile = other.File })
	a, b := relays[0], relays[1]
	HolderFor(t, relays, "dev") // both fresh: they probe each other
	Eventually(t, 10*time.Second, func() error {
		if !a.Node.Vetoed(b.Node.Fleet().ID()) {
			return fmt.Errorf("relay %s does not veto %s yet", a.Node.Fleet().ID(), b.Node.Fleet().ID())
		}
		return nil
	})
	// Events are published in the background: wait for this one.
	Eventually(t, 10*time.Second, func() error {
		events, err := a.Node.Fleet().Events(t.Context(), 100)
		if err != nil {
			return err
		}
		for _, e := range events {
			if e.Type == node.EventRelayVetoed && e.RelayID == b.Node.Fleet().ID() {
				if !strings.Contains(e.Message, "certificate signed by unknown authority") {
					t.Errorf("veto event %q does not say the certificate was not trusted", e.Message)
				}
				return nil
			}
		}
		return fmt.Errorf("no veto event for %s in %v", b.Node.Fleet().ID(), events)
	})
}
