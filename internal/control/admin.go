package control

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/limit"
	"github.com/switchboard-relay/switchboard/internal/ports"
	"github.com/switchboard-relay/switchboard/internal/topic"
)

// Paths of the admin page, a server-rendered view of the fleet for people.
const (
	PathAdmin       = "/admin/"       // GET: the page, or the sign-in form
	PathAdminLogin  = "/admin/login"  // POST token=<admin token>
	PathAdminLogout = "/admin/logout" // POST
	pathAdminStyle  = "/admin/style.css"
	pathAdminRelays = "/admin/relays/" // POST {id}/drain, {id}/undrain
)

// Log attribute keys of the admin page, besides those of handler.go.
const (
	attrRelay    = "relay"
	attrDraining = "draining"
	attrOrigin   = "origin"
	attrHost     = "host"
	attrPath     = "path"
	attrTemplate = "template"
)

const (
	// adminCookie names the cookie that keeps a browser signed in to the
	// admin page. It holds an auth session, never the admin token.
	adminCookie = "switchboard_admin"
	// adminSignInLifetime is how long a sign-in through the form lasts.
	adminSignInLifetime = 12 * time.Hour

	adminRefreshSeconds = 5   // how often the page reloads itself
	adminEventsShown    = 50  // the most recent events the page lists
	adminEventsRead     = 500 // the events read for the port events the page lists, of which it shows adminEventsShown
	maxSignInBodyBytes  = 4 << 10
	// adminReadTimeout bounds reading the event log for one page, so that
	// an unreachable NATS slows the page down without hiding the rest.
	adminReadTimeout = 3 * time.Second
	// adminWriteTimeout bounds changing a relay's drain flag.
	adminWriteTimeout = 10 * time.Second
	// drainVisibleTimeout bounds the wait for this relay's copy of the fleet
	// state to show a drain flag just written; see awaitDraining.
	drainVisibleTimeout = 2 * time.Second
)

// adminContentSecurity allows the page its own style sheet and forms, and
// nothing else: no script runs, whatever a relay or device name holds.
const adminContentSecurity = "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

//go:embed admin/*.html
var adminFiles embed.FS

//go:embed admin/style.css
var adminStyle []byte

// adminTemplates are the page's templates, parsed once: a failure is a bug in
// the embedded files and stops the program at start, never at a request.
var adminTemplates = template.Must(template.ParseFS(adminFiles, "admin/*.html"))

// adminPage serves the admin page and its forms.
type adminPage struct {
	h    *handler
	csrf *http.CrossOriginProtection
}

// routeAdmin registers the admin page under PathAdmin.
func (h *handler) routeAdmin(mux *http.ServeMux) {
	p := &adminPage{h: h, csrf: http.NewCrossOriginProtection()}
	mux.HandleFunc("GET "+PathAdmin+"{$}", p.signedIn(p.show))
	for _, path := range []string{strings.TrimSuffix(PathAdmin, "/"), PathAdminLogin, PathAdminLogout} {
		mux.HandleFunc("GET "+path, p.toPage) // an address typed or bookmarked
	}
	mux.HandleFunc("GET "+pathAdminStyle, p.serveStyle)
	mux.HandleFunc("POST "+PathAdminLogin, p.sameOrigin(p.login))
	mux.HandleFunc("POST "+PathAdminLogout, p.sameOrigin(p.logout))
	mux.HandleFunc("POST "+pathAdminRelays+"{id}/drain", p.sameOrigin(p.signedIn(p.setDraining(true))))
	mux.HandleFunc("POST "+pathAdminRelays+"{id}/undrain", p.sameOrigin(p.signedIn(p.setDraining(false))))
}

// caller is who is using the page.
type caller struct {
	auth.Principal
	cookie bool // signed in through the form rather than by a bearer token
}

// identify returns the admin calling, by the bearer token when one is sent,
// else by the sign-in cookie. Its errors are those of auth.Store's
// Authenticate and AuthenticateSession, and auth.ErrWrongKind for a valid
// token that is not an admin token.
func (p *adminPage) identify(r *http.Request) (caller, error) {
	if token := bearerToken(r); token != "" {
		pr, err := p.h.cfg.Tokens.AuthenticateKind(token, auth.KindAdmin)
		return caller{Principal: pr}, err
	}
	c, err := r.Cookie(adminCookie)
	if err != nil {
		return caller{cookie: true}, auth.ErrNoToken
	}
	pr, err := p.h.cfg.Tokens.AuthenticateSession(c.Value)
	if err == nil && pr.Kind != auth.KindAdmin {
		err = auth.ErrWrongKind
	}
	return caller{Principal: pr, cookie: true}, err
}

// signedIn lets a request through to next only from an admin, and answers
// everyone else with the sign-in form.
func (p *adminPage) signedIn(next func(http.ResponseWriter, *http.Request, caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p.h.cfg.Tokens == nil {
			p.fail(w, http.StatusServiceUnavailable, "The token store is not available on this relay, so nobody can sign in to its admin page.")
			return
		}
		who, err := p.identify(r)
		if err == nil {
			next(w, r, who)
			return
		}
		status, msg := refusal(w, who, err)
		if who.cookie && !errors.Is(err, auth.ErrNoToken) {
			http.SetCookie(w, signInCookie(r, "", -1))
		}
		p.render(w, status, "signin", signInView{pageHead: head("Sign in"), Message: msg})
	}
}

// refusal is the status and message of the sign-in form shown to a caller
// who is not let in because of err. It sets the WWW-Authenticate header that
// goes with a bearer token's refusal.
func refusal(w http.ResponseWriter, who caller, err error) (int, string) {
	switch {
	case errors.Is(err, auth.ErrWrongKind):
		return http.StatusForbidden, "The admin page needs an admin token, not an agent or user token: " + adminTokenHint + "."
	case errors.Is(err, auth.ErrSessionExpired):
		return http.StatusUnauthorized, fmt.Sprintf("Your sign-in has expired (it lasts %d hours). Sign in again.", int(adminSignInLifetime.Hours()))
	case errors.Is(err, auth.ErrNoToken):
		w.Header().Set("WWW-Authenticate", `Bearer realm="switchboard"`)
		return http.StatusUnauthorized, ""
	case who.cookie:
		return http.StatusUnauthorized, "Your sign-in is no longer valid: its admin token was revoked, or the cookie was altered. Sign in again."
	default:
		w.Header().Set("WWW-Authenticate", `Bearer realm="switchboard", error="invalid_token"`)
		return http.StatusUnauthorized, "Invalid admin token (unknown, revoked or malformed): " + adminTokenHint + "."
	}
}

// sameOrigin refuses a form posted from another site, which a browser might
// send with the admin's cookie on another page's behalf. Requests without
// the browser's Sec-Fetch-Site and Origin headers, from scripts, pass.
func (p *adminPage) sameOrigin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := p.csrf.Check(r); err != nil {
			p.h.log.Warn("refused a cross-origin form on the admin page", attrOrigin, r.Header.Get("Origin"), attrHost, r.Host, attrPath, r.URL.Path)
			p.fail(w, http.StatusForbidden, fmt.Sprintf(
				"Refused: this form was sent from another site (Origin %q, host %q). The admin page only accepts its own forms; open %s on this relay and use the buttons there.",
				r.Header.Get("Origin"), r.Host, PathAdmin))
			return
		}
		next(w, r)
	}
}

// login checks the admin token typed into the sign-in form and answers with
// a cookie that keeps the browser signed in for adminSignInLifetime.
func (p *adminPage) login(w http.ResponseWriter, r *http.Request) {
	tokens := p.h.cfg.Tokens
	if tokens == nil {
		p.fail(w, http.StatusServiceUnavailable, "The token store is not available on this relay, so nobody can sign in to its admin page.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxSignInBodyBytes)
	if err := r.ParseForm(); err != nil {
		p.render(w, http.StatusBadRequest, "signin", signInView{pageHead: head("Sign in"), Message: "The sign-in form could not be read: " + err.Error()})
		return
	}
	pr, err := p.h.authenticate(r, func() (auth.Principal, error) {
		return tokens.AuthenticateKind(strings.TrimSpace(r.PostForm.Get("token")), auth.KindAdmin)
	})
	if errors.Is(err, limit.ErrTooManyFailures) {
		p.render(w, http.StatusTooManyRequests, "signin", signInView{pageHead: head("Sign in"), Message: err.Error() + "."})
		return
	}
	if err != nil {
		status, msg := http.StatusUnauthorized, "Invalid admin token (unknown, revoked or mistyped): "+adminTokenHint+"."
		switch {
		case errors.Is(err, auth.ErrNoToken):
			msg = "Enter the admin token: " + adminTokenHint + "."
		case errors.Is(err, auth.ErrWrongKind):
			status = http.StatusForbidden
			msg = "Only admin tokens may sign in to this page (" + err.Error() + "): " + adminTokenHint + "."
		}
		p.render(w, status, "signin", signInView{pageHead: head("Sign in"), Message: msg})
		return
	}
	value, err := tokens.NewSession(pr.TokenID, adminSignInLifetime)
	if err != nil {
		p.h.log.Error("signing in to the admin page", attrTokenID, pr.TokenID, attrError, err)
		p.fail(w, http.StatusInternalServerError, "Signing in failed: "+err.Error())
		return
	}
	p.h.log.Info("signed in to the admin page", attrTokenID, pr.TokenID)
	http.SetCookie(w, signInCookie(r, value, int(adminSignInLifetime/time.Second)))
	http.Redirect(w, r, PathAdmin, http.StatusSeeOther)
}

// logout signs the browser out by clearing its cookie.
func (p *adminPage) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, signInCookie(r, "", -1))
	http.Redirect(w, r, PathAdmin, http.StatusSeeOther)
}

// signInCookie is the admin page's cookie with value, kept for maxAge
// seconds; a negative maxAge deletes it. It is Secure when the request came
// over TLS: a browser would not send a Secure cookie back over plain HTTP.
func signInCookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name:     adminCookie,
		Value:    value,
		Path:     PathAdmin,
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	}
}

// setDraining answers the drain and undrain buttons.
func (p *adminPage) setDraining(draining bool) func(http.ResponseWriter, *http.Request, caller) {
	return func(w http.ResponseWriter, r *http.Request, who caller) {
		f := p.h.cfg.Fleet
		if f == nil {
			p.fail(w, http.StatusServiceUnavailable, "The fleet state is not available on this relay, so relays cannot be drained from here.")
			return
		}
		id := r.PathValue("id")
		ctx, cancel := context.WithTimeout(r.Context(), adminWriteTimeout)
		defer cancel()
		err := fmt.Errorf("relay %q: %w", id, fleet.ErrNotFound)
		if fleet.ValidRelayID(id) {
			_, err = p.h.setDraining(ctx, id, draining, DrainRequest{}, false, false)
		}
		if err != nil {
			status, msg := drainFailure(id, err)
			p.h.log.Warn("setting a relay's drain flag from the admin page", attrRelay, id, attrError, err)
			p.fail(w, status, msg)
			return
		}
		p.h.log.Info("relay drain flag set from the admin page", attrRelay, id, attrDraining, draining, attrTokenID, who.TokenID)
		awaitDraining(ctx, f, id, draining)
		http.Redirect(w, r, PathAdmin, http.StatusSeeOther)
	}
}

// drainFailure is the status and message of a failed drain or undrain.
func drainFailure(id string, err error) (int, string) {
	if errors.Is(err, errDrainRefused) {
		return http.StatusConflict, fmt.Sprintf("Relay %s was not drained: %v. To drain it anyway, run 'switchboard ctl relays drain --force %s'.", id, err, id)
	}
	if errors.Is(err, fleet.ErrNotFound) {
		return http.StatusNotFound, fmt.Sprintf("No relay has id %q. It may have been removed from the fleet; the admin page lists the relays known now.", id)
	}
	return http.StatusServiceUnavailable, fmt.Sprintf("The drain flag of relay %q could not be changed (is NATS reachable?): %v", id, err)
}

// awaitDraining waits, at most drainVisibleTimeout, until this relay's copy
// of the fleet state shows relay id's drain flag as just written. The page
// reads that copy, which a watch on NATS updates a moment after the write;
// waiting lets the page the operator is sent back to show the new state.
func awaitDraining(ctx context.Context, f Fleet, id string, draining bool) {
	ctx, cancel := context.WithTimeout(ctx, drainVisibleTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if rs, err := f.Relay(id); err != nil || rs.Draining == draining {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// toPage sends a browser that asked for another admin address to the page.
func (p *adminPage) toPage(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, PathAdmin, http.StatusSeeOther)
}

func (p *adminPage) serveStyle(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(adminStyle)
}

// show renders the fleet: relays, devices and recent events.
func (p *adminPage) show(w http.ResponseWriter, r *http.Request, who caller) {
	v := fleetView{
		pageHead:   head("Fleet"),
		SignedIn:   who.TokenID,
		TokenName:  who.Name,
		CanSignOut: who.cookie,
		Now:        time.Now().UTC().Format(time.RFC3339),
	}
	v.RefreshSeconds = adminRefreshSeconds
	if f := p.h.cfg.Fleet; f != nil {
		p.fillFleet(r.Context(), &v, f)
	}
	if p.h.cfg.Topics != nil {
		v.Topics = p.h.cfg.Topics()
	}
	p.fillPorts(&v)
	p.render(w, http.StatusOK, "page", v)
}

func (p *adminPage) fillFleet(ctx context.Context, v *fleetView, f Fleet) {
	now := time.Now()
	v.Fleet = true
	v.Status = f.Status()
	for _, rs := range f.Relays() {
		v.Relays = append(v.Relays, relayRow{
			RelayStatus: rs,
			This:        rs.ID == v.Status.RelayID,
			LastSeen:    ago(now, rs.LastSeenAt),
			LastSeenAt:  stamp(rs.LastSeenAt),
			DrainPath:   pathAdminRelays + url.PathEscape(rs.ID) + "/drain",
			UndrainPath: pathAdminRelays + url.PathEscape(rs.ID) + "/undrain",
		})
	}
	for _, d := range f.Devices() {
		v.Devices = append(v.Devices, deviceRow{DeviceStatus: d, Attached: ago(now, d.AttachedAt), AttachedAt: stamp(d.AttachedAt)})
	}
	ctx, cancel := context.WithTimeout(ctx, adminReadTimeout)
	defer cancel()
	evs, err := f.Events(ctx, adminEventsRead)
	if err != nil {
		p.h.log.Warn("reading events for the admin page", attrError, err)
		v.EventsError = "The event log cannot be read now (is NATS reachable?): " + err.Error()
		return
	}
	slices.Reverse(evs) // newest first
	for _, e := range evs {
		row := eventRow{Event: e, At: stamp(e.Time)}
		if len(v.Events) < adminEventsShown {
			v.Events = append(v.Events, row)
		}
		if isPortEvent(e.Type) && len(v.PortEvents) < adminEventsShown {
			v.PortEvents = append(v.PortEvents, row)
		}
	}
}

// isPortEvent reports whether events of type tell of mapped ports or the
// TCP connections through them and switchboard connect.
func isPortEvent(typ string) bool {
	return strings.HasPrefix(typ, "ports.") || strings.HasPrefix(typ, "tcp.")
}

// fillPorts lists the fleet's port mappings, with the connections open
// through each on this relay.
func (p *adminPage) fillPorts(v *fleetView) {
	if p.h.cfg.Ports == nil {
		return
	}
	v.HasPorts = true
	var open map[int]int
	if p.h.cfg.PortConns != nil {
		open = p.h.cfg.PortConns()
	}
	for _, m := range p.h.cfg.Ports.List() {
		row := portRow{Mapping: m, Allowed: strings.Join(m.Allow, ", "), Created: stamp(m.CreatedAt), Key: m.Key()}
		if m.Network == ports.TCP {
			row.OpenHere = strconv.Itoa(open[m.Port])
		}
		v.Ports = append(v.Ports, row)
	}
}

// fail renders an error page with a way back to the admin page.
func (p *adminPage) fail(w http.ResponseWriter, status int, msg string) {
	p.render(w, status, "error", errorView{pageHead: head(http.StatusText(status)), Status: status, Message: msg})
}

// render executes the named template into a buffer first, so that a failing
// template answers 500 rather than half a page.
func (p *adminPage) render(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := adminTemplates.ExecuteTemplate(&buf, name, data); err != nil {
		p.h.log.Error("rendering the admin page", attrTemplate, name, attrError, err)
		writeText(w, http.StatusInternalServerError, "the admin page could not be rendered: "+err.Error())
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Content-Security-Policy", adminContentSecurity)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w) // the status is sent; a failed write has no one to tell
}

// pageHead is what every page's <head> needs.
type pageHead struct {
	Title          string
	RefreshSeconds int // 0: the page does not reload itself
}

func head(title string) pageHead { return pageHead{Title: title} }

type signInView struct {
	pageHead
	Message string // why the form is shown again; empty the first time
}

type errorView struct {
	pageHead
	Status  int
	Message string
}

type fleetView struct {
	pageHead
	SignedIn    string // the admin token's id
	TokenName   string
	CanSignOut  bool // signed in through the form, so there is a cookie to clear
	Now         string
	Fleet       bool // whether this relay has the fleet state
	Status      fleet.Status
	Relays      []relayRow
	Devices     []deviceRow
	Events      []eventRow
	PortEvents  []eventRow // of mapped ports and TCP connections, newest first
	EventsError string
	Topics      []topic.Stats // on this relay
	HasPorts    bool          // whether this relay has the port mappings
	Ports       []portRow
}

type portRow struct {
	ports.Mapping
	Key      string // tcp-6379
	Allowed  string // the allowlist, or "" for every source
	Created  string
	OpenHere string // TCP connections open through it on this relay; "" for UDP
}

type relayRow struct {
	fleet.RelayStatus
	This        bool   // the relay serving the page
	LastSeen    string // relative, for people
	LastSeenAt  string // absolute, UTC
	DrainPath   string
	UndrainPath string
}

type deviceRow struct {
	fleet.DeviceStatus
	Attached   string
	AttachedAt string
}

type eventRow struct {
	fleet.Event
	At string
}

// stamp formats t in UTC to the second, or "" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago says how long before now t was, coarsely: "4s ago", "3m ago", "2h ago",
// "5d ago", or "never" for the zero time.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h ago"
	default:
		return strconv.Itoa(int(d/(24*time.Hour))) + "d ago"
	}
}
