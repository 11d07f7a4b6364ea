package fleettest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/longpoll"
	"github.com/switchboard-relay/switchboard/internal/relay"
)

// TestNativeFallsBackToLongPoll runs a native agent against a relay that only
// speaks the long-poll protocol (its tunnel endpoint answers 404, as the
// reference relay's does): the agent must fall back and serve.
func TestNativeFallsBackToLongPoll(t *testing.T) {
	b, err := broker.New(broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	h := relay.NewHandler(relay.Config{
		Transport: b,
		Agents:    longpoll.NewHandler(longpoll.Config{Broker: b, Authorize: longpoll.AllowAll}),
		Tunnels:   http.NotFoundHandler(),
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close) // after the agent stops: cleanups run last-in first-out
	backend := newBackend(t, "b1")
	StartAgent(t, &Relay{URL: srv.URL}, "dev", backend.URL, "", protocol(agent.ProtocolNative))
	Eventually(t, 10*time.Second, func() error {
		if !slices.Contains(b.Devices(), "dev") {
			return errNotYet
		}
		return nil
	})
	resp := do(t, http.MethodGet, srv.URL+"/client/dev/echo/x", "", nil)
	if e := decodeEcho(t, resp); e.Path != "/echo/x" {
		t.Fatalf("path %q", e.Path)
	}
}

// TestNativeOverWebSocket carries the tunnel in a WebSocket.
func TestNativeOverWebSocket(t *testing.T) {
	r := StartRelay(t)
	b := newBackend(t, "b1")
	StartAgent(t, r, "dev", b.URL, r.Token(t, auth.KindAgent, "a", "dev"), func(c *agent.Config) {
		c.Protocol, c.WebSocket = agent.ProtocolNative, true
	})
	Eventually(t, 10*time.Second, func() error {
		if r.Node.TunnelSessions() != 1 {
			return errNotYet
		}
		return nil
	})
	resp := do(t, http.MethodPost, r.URL+"/client/dev/echo/ws", r.Token(t, auth.KindUser, "u"), io.LimitReader(zeros{}, 3<<20))
	if e := decodeEcho(t, resp); len(e.Body) != 3<<20 {
		t.Fatalf("backend got %d bytes", len(e.Body))
	}
}
