package control

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestStopNeedsTheAdminToken: only the admin token stops a relay, and a
// relay that cannot be stopped through the API says how to stop it.
func TestStopNeedsTheAdminToken(t *testing.T) {
	f := newFixture(t)
	if code, body := f.call(t, http.MethodPost, PathStop, "", ""); code != http.StatusUnauthorized {
		t.Fatalf("stop without a token: %d %s, want 401", code, body)
	}
	if code, body := f.call(t, http.MethodPost, PathStop, "sbx_00000000_"+strings.Repeat("A", 43), ""); code != http.StatusUnauthorized {
		t.Fatalf("stop with a wrong token: %d %s, want 401", code, body)
	}
	if n := f.stops.Load(); n != 0 {
		t.Fatalf("stopped %d times without the admin token", n)
	}
	if code, body := f.call(t, http.MethodPost, PathStop, f.admin, ""); code != http.StatusAccepted || !strings.Contains(body, `"stopping": true`) {
		t.Fatalf("stop with the admin token: %d %s, want 202 stopping", code, body)
	}
	if n := f.stops.Load(); n != 1 {
		t.Fatalf("Stop called %d times, want 1", n)
	}

	srv := httptest.NewServer(NewHandler(Config{Tokens: f.tokens}))
	defer srv.Close()
	c := &Client{BaseURL: srv.URL, Token: f.admin, HTTPClient: srv.Client()}
	err := c.Stop(context.Background(), time.Second)
	if err == nil || !strings.Contains(err.Error(), "SIGTERM") {
		t.Fatalf("stop of a relay without Stop: %v, want a 503 naming SIGTERM", err)
	}
}

// TestClientStopWaits: Client.Stop returns once the admin listener no
// longer answers, and says the relay is still draining when it answers on.
func TestClientStopWaits(t *testing.T) {
	f := newFixture(t)
	c := f.client(f.admin)
	if err := c.Stop(context.Background(), 600*time.Millisecond); err == nil || !strings.Contains(err.Error(), "still draining") {
		t.Fatalf("stop of a relay that keeps serving: %v, want 'still draining'", err)
	}
	// A relay that stops refuses new connections once it has answered: the
	// listener closes, and without keep-alive every check dials anew.
	var srv *httptest.Server
	srv = httptest.NewUnstartedServer(NewHandler(Config{Tokens: f.tokens, Stop: func() { srv.Listener.Close() }}))
	srv.Config.SetKeepAlivesEnabled(false)
	srv.Start()
	defer srv.Close()
	c = &Client{BaseURL: srv.URL, Token: f.admin}
	if err := c.Stop(context.Background(), 10*time.Second); err != nil {
		t.Fatalf("stop of a relay that goes away: %v", err)
	}
}
