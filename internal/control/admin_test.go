package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// fakeFleet is a Fleet in memory that records drain requests.
type fakeFleet struct {
	mu        sync.Mutex // guards the fields below
	relays    []fleet.RelayStatus
	devices   []fleet.DeviceStatus
	events    []fleet.Event
	eventsErr error // returned by Events when set
	setErr    error // returned by SetRelayDraining when set
	drains    []string
}

var _ Fleet = (*fakeFleet)(nil)

func (f *fakeFleet) Relays() []fleet.RelayStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fleet.RelayStatus(nil), f.relays...)
}

func (f *fakeFleet) Relay(id string) (fleet.RelayStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.relays {
		if r.ID == id {
			return r, nil
		}
	}
	return fleet.RelayStatus{}, fmt.Errorf("relay %q: %w", id, fleet.ErrNotFound)
}

func (f *fakeFleet) Record(e fleet.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, e)
}

func (f *fakeFleet) SetRelayDraining(_ context.Context, id string, draining bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.setErr != nil {
		return f.setErr
	}
	for i := range f.relays {
		if f.relays[i].ID == id {
			f.relays[i].Draining = draining
			f.drains = append(f.drains, fmt.Sprintf("%s=%t", id, draining))
			return nil
		}
	}
	return fmt.Errorf("relay %q: %w", id, fleet.ErrNotFound)
}

// drained returns the drain requests so far, as "id=draining".
func (f *fakeFleet) drained() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.drains...)
}

func (f *fakeFleet) Devices() []fleet.DeviceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fleet.DeviceStatus(nil), f.devices...)
}

func (f *fakeFleet) Device(name string) (fleet.DeviceLink, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.devices {
		if d.Name == name {
			return fleet.DeviceLink{DeviceStatus: d}, nil
		}
	}
	return fleet.DeviceLink{}, fmt.Errorf("device %q: %w", name, fleet.ErrNotFound)
}

func (f *fakeFleet) Events(_ context.Context, n int) ([]fleet.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.eventsErr != nil {
		return nil, f.eventsErr
	}
	return append([]fleet.Event(nil), f.events[max(0, len(f.events)-n):]...), nil
}

func (f *fakeFleet) FollowEvents(ctx context.Context, _ func(fleet.Event) error) error {
	<-ctx.Done()
	return ctx.Err()
}

func (f *fakeFleet) RollEnabled(context.Context) (bool, error)          { return false, nil }
func (f *fakeFleet) SetRollEnabled(context.Context, bool) error         { return nil }
func (f *fakeFleet) Roll(context.Context) (*fleet.RollState, error)     { return nil, nil }
func (f *fakeFleet) SaveRoll(context.Context, fleet.RollState) error    { return nil }
func (f *fakeFleet) ClearRoll(context.Context) error                    { return nil }
func (f *fakeFleet) CancelDevice(context.Context, string, string) error { return nil }

func (f *fakeFleet) Status() fleet.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fleet.Status{RelayID: "rl-00000001", NATSConnected: true, Relays: len(f.relays), Devices: len(f.devices)}
}

func newFakeFleet() *fakeFleet {
	seen := time.Now().Add(-3 * time.Second)
	return &fakeFleet{
		relays: []fleet.RelayStatus{
			{ID: "rl-00000001", Hostname: "edge-1", Region: "eu", Addresses: []string{"http://10.0.0.1:8080"},
				Version: "v1.2.3", Healthy: true, Fresh: true, LastSeenAt: seen, ForwardSessions: 2, MaxForward: 512, AttachedDevices: 1},
			{ID: "rl-00000002", Hostname: "edge-2", Region: "us", Addresses: []string{"http://10.0.0.2:8080"},
				Version: "v1.2.3", Healthy: true, Fresh: true, LastSeenAt: seen, MaxForward: 512},
		},
		devices: []fleet.DeviceStatus{
			{Name: "robot-1", RelayID: "rl-00000001", AttachedAt: seen, Agents: 1, Protocol: "native", Fresh: true, State: fleet.StateOnline},
		},
		events: []fleet.Event{
			{Seq: 1, Time: seen, Type: "relay_enrolled", RelayID: "rl-00000001", Message: "relay rl-00000001 enrolled"},
		},
	}
}

// adminFixture is the admin listener with a fake fleet, on a real token
// store on embedded NATS.
type adminFixture struct {
	*fixture
	fleet *fakeFleet
	page  *httptest.Server
}

func newAdminFixture(t *testing.T) *adminFixture {
	t.Helper()
	f := &adminFixture{fixture: newFixture(t), fleet: newFakeFleet()}
	f.page = httptest.NewServer(NewHandler(Config{Tokens: f.tokens, Fleet: f.fleet}))
	t.Cleanup(f.page.Close)
	return f
}

// pageResponse is an answer of the admin page, read in full.
type pageResponse struct {
	status int
	header http.Header
	body   string
	cookie *http.Cookie // the admin cookie it set, if any
}

// adminRequest sends a request to srv without following redirects. setup may add
// headers.
func adminRequest(t *testing.T, srv *httptest.Server, method, path string, form url.Values, setup func(*http.Request)) pageResponse {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if setup != nil {
		setup(req)
	}
	c := *srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := pageResponse{status: resp.StatusCode, header: resp.Header, body: string(b)}
	for _, c := range resp.Cookies() {
		if c.Name == adminCookie {
			out.cookie = c
		}
	}
	return out
}

func withBearer(token string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }
}

func withCookie(value string) func(*http.Request) {
	return func(r *http.Request) { r.AddCookie(&http.Cookie{Name: adminCookie, Value: value}) }
}

// fromPage sends the cookie and the headers a browser sends with a form
// posted from the admin page itself.
func fromPage(srv *httptest.Server, cookie string) func(*http.Request) {
	return func(r *http.Request) {
		r.AddCookie(&http.Cookie{Name: adminCookie, Value: cookie})
		r.Header.Set("Origin", srv.URL)
		r.Header.Set("Sec-Fetch-Site", "same-origin")
	}
}

// signIn posts the admin token to the sign-in form and returns the cookie.
func (f *adminFixture) signIn(t *testing.T) string {
	t.Helper()
	resp := adminRequest(t, f.page, http.MethodPost, PathAdminLogin, url.Values{"token": {f.admin}}, func(r *http.Request) {
		r.Header.Set("Origin", f.page.URL)
	})
	if resp.status != http.StatusSeeOther || resp.header.Get("Location") != PathAdmin || resp.cookie == nil {
		t.Fatalf("sign-in = %d, Location %q, cookie %v: %s", resp.status, resp.header.Get("Location"), resp.cookie, resp.body)
	}
	return resp.cookie.Value
}

func (f *adminFixture) adminTokenID(t *testing.T) string {
	t.Helper()
	p, err := f.tokens.Authenticate(f.admin)
	if err != nil {
		t.Fatal(err)
	}
	return p.TokenID
}

// isSignInForm reports whether body is the sign-in form rather than the
// fleet.
func isSignInForm(body string) bool {
	return strings.Contains(body, `action="/admin/login"`) && !strings.Contains(body, "rl-00000001")
}

func TestAdminShowsSignInFormWithoutAuth(t *testing.T) {
	f := newAdminFixture(t)
	resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, nil)
	if resp.status != http.StatusUnauthorized || !isSignInForm(resp.body) {
		t.Fatalf("GET /admin/ without auth = %d:\n%s", resp.status, resp.body)
	}
	if !strings.HasPrefix(resp.header.Get("Content-Type"), "text/html") || resp.header.Get("WWW-Authenticate") == "" {
		t.Fatalf("headers = %v", resp.header)
	}
	if strings.Contains(resp.body, `http-equiv="refresh"`) {
		t.Fatal("the sign-in form reloads itself, which would clear a token being typed")
	}
	for _, path := range []string{"/admin", PathAdminLogin, PathAdminLogout} {
		if resp := adminRequest(t, f.page, http.MethodGet, path, nil, nil); resp.status != http.StatusSeeOther || resp.header.Get("Location") != PathAdmin {
			t.Fatalf("GET %s = %d, Location %q", path, resp.status, resp.header.Get("Location"))
		}
	}
}

func TestAdminAcceptsBearerToken(t *testing.T) {
	f := newAdminFixture(t)
	resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withBearer(f.admin))
	if resp.status != http.StatusOK {
		t.Fatalf("GET /admin/ with the admin token = %d:\n%s", resp.status, resp.body)
	}
	for _, want := range []string{
		`<meta name="viewport"`, `<meta http-equiv="refresh" content="5">`, `href="/admin/style.css"`,
		`data-relay="rl-00000001"`, "edge-2", "http://10.0.0.1:8080", "v1.2.3", "2 / 512",
		`data-device="robot-1"`, "native", "relay rl-00000001 enrolled",
		`action="/admin/relays/rl-00000001/drain"`, `class="scroll"`,
	} {
		if !strings.Contains(resp.body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(resp.body, "Sign out") {
		t.Error("a page shown for a bearer token offers to sign out")
	}
	if csp := resp.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	if cc := resp.header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control = %q", cc)
	}
	if t.Failed() {
		t.Log(resp.body)
	}
}

func TestAdminServesStyleSheet(t *testing.T) {
	f := newAdminFixture(t)
	resp := adminRequest(t, f.page, http.MethodGet, pathAdminStyle, nil, nil)
	if resp.status != http.StatusOK || !strings.HasPrefix(resp.header.Get("Content-Type"), "text/css") || !strings.Contains(resp.body, ".scroll") {
		t.Fatalf("GET %s = %d %q", pathAdminStyle, resp.status, resp.header.Get("Content-Type"))
	}
}

func TestAdminRefusesOtherKindsOfToken(t *testing.T) {
	f := newAdminFixture(t)
	ctx := context.Background()
	user, _, err := f.tokens.Create(ctx, auth.CreateRequest{Kind: auth.KindUser, Name: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	agent, _, err := f.tokens.Create(ctx, auth.CreateRequest{Kind: auth.KindAgent, Devices: []string{"robot-1"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, token := range map[string]string{"user": user, "agent": agent} {
		t.Run(name, func(t *testing.T) {
			resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withBearer(token))
			if resp.status != http.StatusForbidden || !isSignInForm(resp.body) || !strings.Contains(resp.body, "needs an admin token") {
				t.Fatalf("GET /admin/ with a %s token = %d:\n%s", name, resp.status, resp.body)
			}
			resp = adminRequest(t, f.page, http.MethodPost, PathAdminLogin, url.Values{"token": {token}}, nil)
			if resp.status != http.StatusForbidden || resp.cookie != nil || !strings.Contains(resp.body, "Only admin tokens may sign in") {
				t.Fatalf("signing in with a %s token = %d, cookie %v:\n%s", name, resp.status, resp.cookie, resp.body)
			}
		})
	}
}

func TestAdminSignInWithWrongToken(t *testing.T) {
	f := newAdminFixture(t)
	for _, token := range []string{"", "nonsense", "sbx_00000000_" + strings.Repeat("A", 43)} {
		resp := adminRequest(t, f.page, http.MethodPost, PathAdminLogin, url.Values{"token": {token}}, nil)
		if resp.status != http.StatusUnauthorized || resp.cookie != nil || !isSignInForm(resp.body) || !strings.Contains(resp.body, `role="alert"`) {
			t.Fatalf("signing in with %q = %d, cookie %v:\n%s", token, resp.status, resp.cookie, resp.body)
		}
	}
	resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withBearer("nonsense"))
	if resp.status != http.StatusUnauthorized || !strings.Contains(resp.body, "Invalid admin token") {
		t.Fatalf("GET /admin/ with a bad bearer token = %d:\n%s", resp.status, resp.body)
	}
}

func TestAdminSignInSetsCookie(t *testing.T) {
	f := newAdminFixture(t)
	resp := adminRequest(t, f.page, http.MethodPost, PathAdminLogin, url.Values{"token": {" " + f.admin + "\n"}}, nil)
	c := resp.cookie
	if resp.status != http.StatusSeeOther || c == nil {
		t.Fatalf("sign-in = %d, cookie %v:\n%s", resp.status, c, resp.body)
	}
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != PathAdmin || c.Secure || c.MaxAge != int(adminSignInLifetime/time.Second) {
		t.Fatalf("cookie = %+v; want HttpOnly, SameSite=Strict, Path=%s, not Secure over plain HTTP, Max-Age 12h", c, PathAdmin)
	}
	secret := f.admin[len("sbx_00000000_"):] // the secret may hold '_' itself
	if strings.Contains(c.Value, secret) {
		t.Fatalf("cookie %q carries the admin token's secret", c.Value)
	}

	page := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withCookie(c.Value))
	if page.status != http.StatusOK || !strings.Contains(page.body, `data-relay="rl-00000001"`) || !strings.Contains(page.body, "Sign out") {
		t.Fatalf("GET /admin/ with the cookie = %d:\n%s", page.status, page.body)
	}

	out := adminRequest(t, f.page, http.MethodPost, PathAdminLogout, nil, fromPage(f.page, c.Value))
	if out.status != http.StatusSeeOther || out.cookie == nil || out.cookie.MaxAge >= 0 {
		t.Fatalf("sign-out = %d, cookie %+v", out.status, out.cookie)
	}
}

func TestAdminRefusesBadCookies(t *testing.T) {
	f := newAdminFixture(t)
	good := f.signIn(t)
	flipped := good[:len(good)-1] + map[bool]string{true: "B", false: "A"}[strings.HasSuffix(good, "A")]
	id, rest, _ := strings.Cut(good, ".")
	_, mac, _ := strings.Cut(rest, ".")
	longer := id + "." + fmt.Sprint(time.Now().Add(30*24*time.Hour).Unix()) + "." + mac
	for name, cookie := range map[string]string{
		"altered mac":    flipped,
		"longer expiry":  longer,
		"the token":      f.admin,
		"garbage":        "hello",
		"another id":     "00000000" + good[len(id):],
		"trailing parts": good + ".x",
	} {
		t.Run(name, func(t *testing.T) {
			resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withCookie(cookie))
			if resp.status != http.StatusUnauthorized || !isSignInForm(resp.body) || !strings.Contains(resp.body, "no longer valid") {
				t.Fatalf("GET /admin/ = %d:\n%s", resp.status, resp.body)
			}
			if resp.cookie == nil || resp.cookie.MaxAge >= 0 {
				t.Fatalf("the refused cookie is not cleared: %+v", resp.cookie)
			}
		})
	}
}

func TestAdminRefusesExpiredCookie(t *testing.T) {
	f := newAdminFixture(t)
	cookie, err := f.tokens.NewSession(f.adminTokenID(t), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withCookie(cookie))
		if resp.status != http.StatusUnauthorized || !strings.Contains(resp.body, "has expired") {
			return fmt.Errorf("GET /admin/ with a cookie past its lifetime = %d", resp.status)
		}
		return nil
	})
}

func TestAdminRefusesRevokedTokensCookie(t *testing.T) {
	f := newAdminFixture(t)
	cookie := f.signIn(t)
	if err := f.tokens.Revoke(context.Background(), f.adminTokenID(t)); err != nil {
		t.Fatal(err)
	}
	resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withCookie(cookie))
	if resp.status != http.StatusUnauthorized || !strings.Contains(resp.body, "revoked") {
		t.Fatalf("GET /admin/ with a revoked token's cookie = %d:\n%s", resp.status, resp.body)
	}
	resp = adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000001/drain", nil, fromPage(f.page, cookie))
	if resp.status != http.StatusUnauthorized || len(f.fleet.drained()) != 0 {
		t.Fatalf("drain with a revoked token's cookie = %d, drains %v", resp.status, f.fleet.drained())
	}
}

func TestAdminDrainButtons(t *testing.T) {
	f := newAdminFixture(t)
	cookie := f.signIn(t)
	resp := adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000002/drain", nil, fromPage(f.page, cookie))
	if resp.status != http.StatusSeeOther || resp.header.Get("Location") != PathAdmin {
		t.Fatalf("drain = %d, Location %q:\n%s", resp.status, resp.header.Get("Location"), resp.body)
	}
	page := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withCookie(cookie))
	if !strings.Contains(page.body, `action="/admin/relays/rl-00000002/undrain"`) {
		t.Fatalf("after the drain the page offers no undrain button:\n%s", page.body)
	}
	resp = adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000002/undrain", nil, fromPage(f.page, cookie))
	if resp.status != http.StatusSeeOther {
		t.Fatalf("undrain = %d:\n%s", resp.status, resp.body)
	}
	// A script sends no Origin and authenticates with the bearer token.
	resp = adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000001/drain", nil, withBearer(f.admin))
	if resp.status != http.StatusSeeOther {
		t.Fatalf("drain with the bearer token = %d:\n%s", resp.status, resp.body)
	}
	want := []string{"rl-00000002=true", "rl-00000002=false", "rl-00000001=true"}
	if got := f.fleet.drained(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("drains = %v, want %v", got, want)
	}
}

func TestAdminDrainRefusesCrossOrigin(t *testing.T) {
	f := newAdminFixture(t)
	cookie := f.signIn(t)
	tests := map[string]func(*http.Request){
		"other origin": func(r *http.Request) {
			r.AddCookie(&http.Cookie{Name: adminCookie, Value: cookie})
			r.Header.Set("Origin", "http://evil.example")
		},
		"null origin": func(r *http.Request) {
			r.AddCookie(&http.Cookie{Name: adminCookie, Value: cookie})
			r.Header.Set("Origin", "null")
		},
		"cross-site fetch": func(r *http.Request) {
			r.AddCookie(&http.Cookie{Name: adminCookie, Value: cookie})
			r.Header.Set("Sec-Fetch-Site", "cross-site")
		},
		"same-site other port": func(r *http.Request) {
			r.AddCookie(&http.Cookie{Name: adminCookie, Value: cookie})
			r.Header.Set("Origin", "http://127.0.0.1:1")
			r.Header.Set("Sec-Fetch-Site", "same-site")
		},
		"bearer from another origin": func(r *http.Request) {
			r.Header.Set("Authorization", "Bearer "+f.admin)
			r.Header.Set("Origin", "http://evil.example")
		},
	}
	for name, setup := range tests {
		t.Run(name, func(t *testing.T) {
			resp := adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000001/drain", nil, setup)
			if resp.status != http.StatusForbidden || !strings.Contains(resp.body, "another site") {
				t.Fatalf("drain = %d:\n%s", resp.status, resp.body)
			}
		})
	}
	resp := adminRequest(t, f.page, http.MethodPost, PathAdminLogin, url.Values{"token": {f.admin}}, func(r *http.Request) {
		r.Header.Set("Origin", "http://evil.example")
	})
	if resp.status != http.StatusForbidden || resp.cookie != nil {
		t.Fatalf("sign-in from another origin = %d, cookie %v", resp.status, resp.cookie)
	}
	if got := f.fleet.drained(); len(got) != 0 {
		t.Fatalf("cross-origin forms changed the fleet: %v", got)
	}
}

func TestAdminDrainFailures(t *testing.T) {
	f := newAdminFixture(t)
	cookie := f.signIn(t)
	resp := adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-99999999/drain", nil, fromPage(f.page, cookie))
	if resp.status != http.StatusNotFound || !strings.Contains(resp.body, `No relay has id &#34;rl-99999999&#34;`) || !strings.Contains(resp.body, `href="/admin/"`) {
		t.Fatalf("drain of an unknown relay = %d:\n%s", resp.status, resp.body)
	}
	resp = adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"not%20a%20relay/drain", nil, fromPage(f.page, cookie))
	if resp.status != http.StatusNotFound || !strings.Contains(resp.body, `No relay has id &#34;not a relay&#34;`) {
		t.Fatalf("drain of a malformed relay id = %d:\n%s", resp.status, resp.body)
	}
	f.fleet.mu.Lock()
	f.fleet.setErr = fmt.Errorf("update: %w", context.DeadlineExceeded)
	f.fleet.mu.Unlock()
	resp = adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000001/drain", nil, fromPage(f.page, cookie))
	if resp.status != http.StatusServiceUnavailable || !strings.Contains(resp.body, "is NATS reachable?") {
		t.Fatalf("drain with NATS away = %d:\n%s", resp.status, resp.body)
	}
	resp = adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000001/drain", nil, func(r *http.Request) { r.Header.Set("Origin", f.page.URL) })
	if resp.status != http.StatusUnauthorized || !isSignInForm(resp.body) {
		t.Fatalf("drain without signing in = %d:\n%s", resp.status, resp.body)
	}
}

func TestAdminShowsEventLogFailure(t *testing.T) {
	f := newAdminFixture(t)
	f.fleet.mu.Lock()
	f.fleet.eventsErr = errors.New("nats: no responders available for request")
	f.fleet.mu.Unlock()
	resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withBearer(f.admin))
	if resp.status != http.StatusOK || !strings.Contains(resp.body, "event log cannot be read") || !strings.Contains(resp.body, "edge-1") {
		t.Fatalf("GET /admin/ with the event log away = %d:\n%s", resp.status, resp.body)
	}
}

func TestAdminEscapesNames(t *testing.T) {
	f := newAdminFixture(t)
	f.fleet.mu.Lock()
	f.fleet.relays[0].Hostname = "<script>alert(1)</script>"
	f.fleet.relays[0].Region = `"><img src=x onerror=alert(2)>`
	f.fleet.relays[0].Addresses = []string{"javascript:alert(3)"}
	f.fleet.devices[0].Name = `<b onmouseover="alert(4)">robot</b>`
	f.fleet.events[0].Message = "<script>alert(5)</script>"
	f.fleet.mu.Unlock()
	resp := adminRequest(t, f.page, http.MethodGet, PathAdmin, nil, withBearer(f.admin))
	if resp.status != http.StatusOK {
		t.Fatalf("GET /admin/ = %d", resp.status)
	}
	for _, bad := range []string{"<script>", "<img", "<b onmouseover"} {
		if strings.Contains(resp.body, bad) {
			t.Errorf("the page contains %q unescaped", bad)
		}
	}
	for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(2)&gt;", "&lt;b onmouseover="} {
		if !strings.Contains(resp.body, want) {
			t.Errorf("the page lacks the escaped %q", want)
		}
	}
	if t.Failed() {
		t.Log(resp.body)
	}
}

func TestAdminWithoutFleet(t *testing.T) {
	f := newFixture(t) // its handler has no fleet state
	resp := adminRequest(t, f.srv, http.MethodGet, PathAdmin, nil, withBearer(f.admin))
	if resp.status != http.StatusOK || !strings.Contains(resp.body, "fleet state is not available") {
		t.Fatalf("GET /admin/ without fleet state = %d:\n%s", resp.status, resp.body)
	}
	resp = adminRequest(t, f.srv, http.MethodPost, pathAdminRelays+"rl-00000001/drain", nil, withBearer(f.admin))
	if resp.status != http.StatusServiceUnavailable || !strings.Contains(resp.body, "fleet state is not available") {
		t.Fatalf("drain without fleet state = %d:\n%s", resp.status, resp.body)
	}
}

func TestAdminWithoutTokenStore(t *testing.T) {
	srv := httptest.NewServer(NewHandler(Config{Fleet: newFakeFleet()}))
	defer srv.Close()
	resp := adminRequest(t, srv, http.MethodGet, PathAdmin, nil, nil)
	if resp.status != http.StatusServiceUnavailable || !strings.Contains(resp.body, "token store is not available") {
		t.Fatalf("GET /admin/ without a token store = %d:\n%s", resp.status, resp.body)
	}
	resp = adminRequest(t, srv, http.MethodPost, PathAdminLogin, url.Values{"token": {"x"}}, nil)
	if resp.status != http.StatusServiceUnavailable {
		t.Fatalf("sign-in without a token store = %d:\n%s", resp.status, resp.body)
	}
}

func TestAgo(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		t    time.Time
		want string
	}{
		{time.Time{}, "never"},
		{now.Add(time.Second), "just now"},
		{now.Add(-4500 * time.Millisecond), "4s ago"},
		{now.Add(-3 * time.Minute), "3m ago"},
		{now.Add(-47 * time.Hour), "47h ago"},
		{now.Add(-5 * 24 * time.Hour), "5d ago"},
	}
	for _, tt := range tests {
		if got := ago(now, tt.t); got != tt.want {
			t.Errorf("ago(%v) = %q, want %q", now.Sub(tt.t), got, tt.want)
		}
	}
}

// A fleet's device list is read whole however many devices it has, up to
// MaxAnswerBytes: ten thousand devices are more than 1 MiB of JSON.
func TestListDevicesOfALargeFleet(t *testing.T) {
	f := newAdminFixture(t)
	seen := time.Now()
	f.fleet.devices = nil
	for i := range 10000 {
		f.fleet.devices = append(f.fleet.devices, fleet.DeviceStatus{Name: fmt.Sprintf("robot-%05d", i), RelayID: "rl-00000001",
			AttachedAt: seen, Agents: 1, Protocol: "native", Fresh: true, State: fleet.StateOnline, Standby: "rl-00000002"})
	}
	c := &Client{BaseURL: f.page.URL, Token: f.admin, HTTPClient: f.page.Client()}
	ds, err := c.ListDevices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 10000 || ds[9999].Name != "robot-09999" || ds[9999].Standby != "rl-00000002" {
		t.Fatalf("got %d devices, the last %+v", len(ds), ds[len(ds)-1])
	}
}

// An answer larger than the client reads is an error that says so, not a
// truncated decode.
func TestAnswerLargerThanTheClientReads(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `["`)
		chunk := strings.Repeat("x", 1<<20)
		for range MaxAnswerBytes>>20 + 1 {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
		io.WriteString(w, `"]`)
	}))
	defer srv.Close()
	c := &Client{BaseURL: srv.URL, Token: "t", HTTPClient: srv.Client()}
	_, err := c.ListDevices(t.Context())
	if err == nil || !strings.Contains(err.Error(), "larger than the 64 MiB this client reads") {
		t.Fatalf("err = %v", err)
	}
}
