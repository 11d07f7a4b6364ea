package control

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/auth/authtest"
	"github.com/switchboard-relay/switchboard/internal/limit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fixture is an admin listener on a real token store on embedded NATS.
type fixture struct {
	srv      *httptest.Server
	tokens   *auth.Store
	admin    string // the admin token
	ready    atomic.Bool
	draining atomic.Bool
	stops    atomic.Int32 // calls of Config.Stop
	registry *prometheus.Registry
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	tokens, path := authtest.Open(t)
	f := &fixture{tokens: tokens, admin: readFile(t, path), registry: prometheus.NewRegistry()}
	f.ready.Store(true)
	f.srv = httptest.NewServer(NewHandler(Config{
		Tokens:   tokens,
		Metrics:  f.registry,
		Ready:    f.ready.Load,
		Draining: f.draining.Load,
		Stop:     func() { f.stops.Add(1) },
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) client(token string) *Client {
	return &Client{BaseURL: f.srv.URL, Token: token, HTTPClient: f.srv.Client()}
}

// call sends a request and returns the status and body.
func (f *fixture) call(t *testing.T, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestProbes(t *testing.T) {
	f := newFixture(t)
	check := func(path string, wantStatus int, wantBody string) {
		t.Helper()
		status, body := f.call(t, http.MethodGet, path, "", "")
		if status != wantStatus || strings.TrimSpace(body) != wantBody {
			t.Fatalf("GET %s = %d %q, want %d %q", path, status, body, wantStatus, wantBody)
		}
	}
	check(PathHealthz, 200, "ok")
	check(PathReadyz, 200, "ready")
	f.ready.Store(false)
	check(PathReadyz, 503, "not ready")
	f.draining.Store(true)
	check(PathReadyz, 503, "draining")
	check(PathHealthz, 200, "ok")
}

func TestMetrics(t *testing.T) {
	f := newFixture(t)
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "switchboard_test_things_total", Help: "Things."})
	f.registry.MustRegister(c)
	c.Add(3)
	status, body := f.call(t, http.MethodGet, PathMetrics, "", "")
	if status != 200 || !strings.Contains(body, "switchboard_test_things_total 3") {
		t.Fatalf("GET /metrics = %d %q", status, body)
	}
}

// TestProfilesNeedTheAdminToken: Go's profiles are served to the admin
// token only.
func TestProfilesNeedTheAdminToken(t *testing.T) {
	f := newFixture(t)
	user, _, err := f.tokens.Create(context.Background(), auth.CreateRequest{Kind: auth.KindUser, Name: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{PathDebugProfiles, PathDebugProfiles + "heap", PathDebugProfiles + "cmdline", PathDebugProfiles + "profile?seconds=1"} {
		if status, _ := f.call(t, http.MethodGet, path, "", ""); status != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, status)
		}
		if status, _ := f.call(t, http.MethodGet, path, user, ""); status == http.StatusOK {
			t.Errorf("GET %s with a user token: %d", path, status)
		}
	}
	status, body := f.call(t, http.MethodGet, PathDebugProfiles+"heap?debug=1", f.admin, "")
	if status != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Errorf("GET heap profile with the admin token: %d %.80q", status, body)
	}
}

func TestAPIRefusesWithoutAdminToken(t *testing.T) {
	f := newFixture(t)
	agent, _, err := f.tokens.Create(context.Background(), auth.CreateRequest{Kind: auth.KindAgent, Devices: []string{"d"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		token  string
		status int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"garbage", "nonsense", http.StatusUnauthorized},
		{"agent token", agent, http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := f.call(t, http.MethodGet, PathTokens, tt.token, "")
			if status != tt.status {
				t.Fatalf("status %d, want %d (%s)", status, tt.status, body)
			}
			msg := decodeError(t, body)
			if !strings.Contains(msg, "admin.token") {
				t.Fatalf("error %q does not say where the admin token is", msg)
			}
		})
	}
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+PathTokens, nil)
	req.SetBasicAuth("admin", f.admin)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("basic auth: %d, WWW-Authenticate %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
}

func decodeError(t *testing.T, body string) string {
	t.Helper()
	var eb errorBody
	if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Error == "" {
		t.Fatalf("error body %q is not {\"error\": \"...\"}", body)
	}
	return eb.Error
}

func TestCreateToken(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name   string
		body   string
		status int
	}{
		{"agent", `{"kind":"agent","name":"arm","devices":["robot-1","lab-*"]}`, 201},
		{"user all devices", `{"kind":"user","name":"alice"}`, 201},
		{"user scoped", `{"kind":"user","name":"bob","devices":["robot-1"]}`, 201},
		{"admin refused", `{"kind":"admin"}`, 400},
		{"no kind", `{"name":"x","devices":["a"]}`, 400},
		{"agent without devices", `{"kind":"agent"}`, 400},
		{"user without name", `{"kind":"user"}`, 400},
		{"bad device", `{"kind":"agent","devices":["a b"]}`, 400},
		{"unknown field", `{"kind":"agent","devices":["a"],"secret":"x"}`, 400},
		{"trailing data", `{"kind":"agent","devices":["a"]} {}`, 400},
		{"not json", `kind=agent`, 400},
		{"empty", ``, 400},
		{"wrong type", `{"kind":"agent","devices":"a"}`, 400},
		{"too large", `{"kind":"agent","name":"` + strings.Repeat("x", MaxBodyBytes) + `"}`, 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := f.call(t, http.MethodPost, PathTokens, f.admin, tt.body)
			if status != tt.status {
				t.Fatalf("status %d, want %d (%s)", status, tt.status, body)
			}
			if status != 201 {
				decodeError(t, body)
				return
			}
			var ct CreatedToken
			if err := json.Unmarshal([]byte(body), &ct); err != nil {
				t.Fatal(err)
			}
			p, err := f.tokens.Authenticate(ct.Token)
			if err != nil || p.TokenID != ct.ID || ct.CreatedAt.IsZero() || ct.Devices == nil {
				t.Fatalf("created %+v does not authenticate as itself: %+v, %v", ct, p, err)
			}
		})
	}
}

func TestCreatedTokenJSONShape(t *testing.T) {
	f := newFixture(t)
	_, body := f.call(t, http.MethodPost, PathTokens, f.admin, `{"kind":"user","name":"alice"}`)
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "token", "kind", "name", "devices", "created_at"} {
		if _, ok := m[k]; !ok {
			t.Errorf("created token lacks %q: %s", k, body)
		}
	}
	if devices, ok := m["devices"].([]any); !ok || len(devices) != 0 {
		t.Errorf("devices = %v, want []", m["devices"])
	}
}

func TestListAndRevokeTokens(t *testing.T) {
	f := newFixture(t)
	_, body := f.call(t, http.MethodPost, PathTokens, f.admin, `{"kind":"agent","devices":["d1"]}`)
	var ct CreatedToken
	if err := json.Unmarshal([]byte(body), &ct); err != nil {
		t.Fatal(err)
	}

	status, body := f.call(t, http.MethodGet, PathTokens, f.admin, "")
	if status != 200 || strings.Contains(body, ct.Token) || strings.Contains(body, "sha256") || strings.Contains(body, `"token"`) {
		t.Fatalf("GET tokens = %d %s; want 200 without secrets", status, body)
	}
	var list []Token
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 2 { // the admin token and ct
		t.Fatalf("list = %+v, %v; want 2 tokens", list, err)
	}

	if status, body := f.call(t, http.MethodDelete, PathTokens+"/"+ct.ID, f.admin, ""); status != 204 {
		t.Fatalf("DELETE = %d %s, want 204", status, body)
	}
	if _, err := f.tokens.Authenticate(ct.Token); !errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("revoked token authenticates: %v", err)
	}
	status, body = f.call(t, http.MethodDelete, PathTokens+"/0badc0de", f.admin, "")
	if status != 404 || !strings.Contains(decodeError(t, body), "0badc0de") {
		t.Fatalf("DELETE unknown = %d %s, want 404 naming the id", status, body)
	}
}

func TestClient(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.client(f.admin)

	created, err := c.CreateToken(ctx, TokenRequest{Kind: auth.KindAgent, Name: "arm", Devices: []string{"robot-*"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(created.Token, "sba_"+created.ID+"_") || created.Name != "arm" {
		t.Fatalf("CreateToken = %+v", created)
	}
	list, err := c.ListTokens(ctx)
	if err != nil || len(list) != 2 || list[1].ID != created.ID || list[1].Revoked {
		t.Fatalf("ListTokens = %+v, %v", list, err)
	}
	if err := c.RevokeToken(ctx, created.ID); err != nil {
		t.Fatal(err)
	}
	list, _ = c.ListTokens(ctx)
	if !list[1].Revoked || list[1].RevokedAt.IsZero() {
		t.Fatalf("after revoke: %+v", list[1])
	}

	var apiErr *APIError
	if err := c.RevokeToken(ctx, "ffffffff"); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Fatalf("RevokeToken(unknown) = %v, want *APIError 404", err)
	}
	_, err = c.CreateToken(ctx, TokenRequest{Kind: auth.KindAgent})
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, "device") {
		t.Fatalf("CreateToken(no devices) = %v, want *APIError 400 about devices", err)
	}
	_, err = f.client("wrong").ListTokens(ctx)
	if !errors.As(err, &apiErr) || apiErr.Status != 401 {
		t.Fatalf("ListTokens(wrong token) = %v, want *APIError 401", err)
	}
}

func TestClientUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c := &Client{BaseURL: url, Token: "x"}
	if _, err := c.ListTokens(context.Background()); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("ListTokens = %v, want ErrUnreachable", err)
	}
}

func TestClientNonJSONError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream exploded", http.StatusBadGateway)
	}))
	defer srv.Close()
	c := &Client{BaseURL: srv.URL + "/", Token: "x", HTTPClient: srv.Client()}
	var apiErr *APIError
	if err := c.RevokeToken(context.Background(), "x"); !errors.As(err, &apiErr) || apiErr.Status != 502 || apiErr.Message != "upstream exploded" {
		t.Fatalf("RevokeToken = %v, want *APIError 502 upstream exploded", err)
	}
}

// TestBackoffNeverRefusesAValidToken: an address that keeps failing is
// refused (429) on the API and the sign-in form, but the valid admin token
// sent from it still gets in, so that whoever shares the operator's address
// cannot lock the operator out.
func TestBackoffNeverRefusesAValidToken(t *testing.T) {
	tokens, path := authtest.Open(t)
	admin := readFile(t, path)
	srv := httptest.NewServer(NewHandler(Config{
		Tokens:       tokens,
		Fleet:        newFakeFleet(),
		AuthFailures: limit.New(limit.Config{FreeFailures: 2}),
	}))
	t.Cleanup(srv.Close)
	f := &fixture{srv: srv}
	bad := "sbx_00000000_" + strings.Repeat("A", 43)
	for i := range 3 { // two free failures, and the one that opens the window
		if status, body := f.call(t, http.MethodGet, PathTokens, bad, ""); status != http.StatusUnauthorized {
			t.Fatalf("bad token %d: %d %s", i, status, body)
		}
	}
	for _, token := range []string{bad, "nonsense"} {
		if status, body := f.call(t, http.MethodGet, PathTokens, token, ""); status != http.StatusTooManyRequests || !strings.Contains(body, "too many failed") {
			t.Fatalf("%q while refused: %d %s", token, status, body)
		}
	}
	if status, body := f.call(t, http.MethodGet, PathTokens, admin, ""); status != http.StatusOK {
		t.Fatalf("the admin token while its address is refused: %d %s", status, body)
	}
	if resp := adminRequest(t, srv, http.MethodPost, PathAdminLogin, url.Values{"token": {bad}}, nil); resp.status != http.StatusTooManyRequests {
		t.Fatalf("signing in with a bad token while refused: %d\n%s", resp.status, resp.body)
	}
	if resp := adminRequest(t, srv, http.MethodPost, PathAdminLogin, url.Values{"token": {admin}}, nil); resp.status != http.StatusSeeOther || resp.cookie == nil {
		t.Fatalf("signing in with the admin token while refused: %d\n%s", resp.status, resp.body)
	}
}
