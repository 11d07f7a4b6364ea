package control

import (
	"errors"
	"html"
	"net/http"
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/fleet"
)

func TestDrainGuard(t *testing.T) {
	serving := func(id string, attached, maxForward int) fleet.RelayStatus {
		return fleet.RelayStatus{ID: id, Fresh: true, Healthy: true, AttachedDevices: attached, MaxForward: maxForward}
	}
	with := func(rs fleet.RelayStatus, change func(*fleet.RelayStatus)) fleet.RelayStatus {
		change(&rs)
		return rs
	}
	tests := []struct {
		name            string
		relays          []fleet.RelayStatus
		refusal, result string // substrings; "" means none
	}{
		{"another relay serves with room", []fleet.RelayStatus{serving("rl-1", 3, 10), serving("rl-2", 0, 10)}, "", ""},
		{"the only relay", []fleet.RelayStatus{serving("rl-1", 3, 10)},
			"relay rl-1 is the last relay serving: draining it leaves its 3 devices nowhere to go", "still takes new devices"},
		{"the others are drained, stale, stopping or unhealthy", []fleet.RelayStatus{
			serving("rl-1", 1, 10),
			with(serving("rl-2", 0, 10), func(r *fleet.RelayStatus) { r.Draining = true }),
			with(serving("rl-3", 0, 10), func(r *fleet.RelayStatus) { r.Fresh = false }),
			with(serving("rl-4", 0, 10), func(r *fleet.RelayStatus) { r.Stopping = true }),
			with(serving("rl-5", 0, 10), func(r *fleet.RelayStatus) { r.Healthy = false }),
		}, "is the last relay serving: draining it leaves its 1 device nowhere", "no other relay is serving"},
		{"no room on the others", []fleet.RelayStatus{serving("rl-1", 5, 10), serving("rl-2", 8, 10), serving("rl-3", 9, 10)},
			"relay rl-1 holds 5 devices but the other relays have room for 3", "room for 3 of its 5 devices"},
		{"a sibling without a ceiling", []fleet.RelayStatus{serving("rl-1", 5, 10), serving("rl-2", 8, 0)}, "", ""},
		{"already draining", []fleet.RelayStatus{with(serving("rl-1", 2, 10), func(r *fleet.RelayStatus) { r.Draining = true })}, "", "no other relay is serving"},
		{"not serving itself", []fleet.RelayStatus{with(serving("rl-1", 2, 10), func(r *fleet.RelayStatus) { r.Fresh = false })}, "", "no other relay is serving"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refusal, result, err := DrainGuard(tt.relays, "rl-1")
			if err != nil {
				t.Fatal(err)
			}
			if (tt.refusal == "") != (refusal == "") || !strings.Contains(refusal, tt.refusal) {
				t.Errorf("refusal %q, want one with %q", refusal, tt.refusal)
			}
			if (tt.result == "") != (result == "") || !strings.Contains(result, tt.result) {
				t.Errorf("consequence %q, want one with %q", result, tt.result)
			}
		})
	}
	if _, _, err := DrainGuard(nil, "rl-1"); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("unknown relay: %v", err)
	}
}

// TestDrainAPIGuards: the API refuses to drain the last relay serving with
// 409 and what to do, a GET answers the same without draining, and
// force drains it, saying what happens to new devices.
func TestDrainAPIGuards(t *testing.T) {
	f := newAdminFixture(t)
	c := &fixture{srv: f.page}
	path := PathRelays + "/rl-00000001/drain"
	if status, body := c.call(t, http.MethodPost, PathRelays+"/rl-00000002/drain", f.admin, ""); status != http.StatusOK {
		t.Fatalf("draining one of two relays: %d %s", status, body)
	}
	for _, body := range []string{"", `{}`, `{"force": false}`} {
		status, answer := c.call(t, http.MethodPost, path, f.admin, body)
		msg := decodeError(t, answer)
		if status != http.StatusConflict || !strings.Contains(msg, "relay rl-00000001 is the last relay serving: draining it leaves its 1 device nowhere to go") ||
			!strings.Contains(msg, "add a relay first") || !strings.Contains(msg, "ctl relays drain --force rl-00000001") {
			t.Fatalf("draining the last relay serving (body %q): %d %s", body, status, msg)
		}
	}
	status, answer := c.call(t, http.MethodGet, path, f.admin, "")
	if msg := decodeError(t, answer); status != http.StatusConflict || !strings.Contains(msg, "is the last relay serving") || strings.Contains(msg, "--force") {
		t.Fatalf("GET, the check: %d %s", status, msg)
	}
	if status, answer := c.call(t, http.MethodGet, PathRelays+"/rl-00000002/drain", f.admin, ""); status != http.StatusOK || !strings.Contains(answer, `"check": true`) {
		t.Fatalf("GET, the check, of a drained relay: %d %s", status, answer)
	}
	if status, answer := c.call(t, http.MethodPost, path, f.admin, `{"force": 1}`); status != http.StatusBadRequest {
		t.Fatalf("a malformed body: %d %s", status, answer)
	}
	if got := f.fleet.drained(); len(got) != 1 {
		t.Fatalf("refused drains changed the fleet: %v", got)
	}

	status, answer = c.call(t, http.MethodPost, path, f.admin, `{"force": true}`)
	if status != http.StatusOK || !strings.Contains(answer, `"draining": true`) || !strings.Contains(answer, "still takes new devices") {
		t.Fatalf("forced drain: %d %s", status, answer)
	}
	if got := f.fleet.drained(); len(got) != 2 || got[1] != "rl-00000001=true" {
		t.Fatalf("drains after force: %v", got)
	}
	evs := f.fleet.events
	if e := evs[len(evs)-1]; e.Type != fleet.EventRelayDrainForced || e.RelayID != "rl-00000001" || !strings.Contains(e.Message, "still takes new devices") {
		t.Fatalf("event of the forced drain: %+v", e)
	}
	// Draining it again is no change, and passes.
	if status, answer := c.call(t, http.MethodPost, path, f.admin, ""); status != http.StatusOK {
		t.Fatalf("draining a drained relay: %d %s", status, answer)
	}
}

// TestAdminDrainButtonIsGuarded: the admin page's Drain button goes
// through the same guard as the API.
func TestAdminDrainButtonIsGuarded(t *testing.T) {
	f := newAdminFixture(t)
	cookie := f.signIn(t)
	if resp := adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000002/drain", nil, fromPage(f.page, cookie)); resp.status != http.StatusSeeOther {
		t.Fatalf("draining one of two relays = %d:\n%s", resp.status, resp.body)
	}
	resp := adminRequest(t, f.page, http.MethodPost, pathAdminRelays+"rl-00000001/drain", nil, fromPage(f.page, cookie))
	body := html.UnescapeString(resp.body)
	if resp.status != http.StatusConflict || !strings.Contains(body, "is the last relay serving") ||
		!strings.Contains(body, "run 'switchboard ctl relays drain --force rl-00000001'") {
		t.Fatalf("draining the last relay serving from the page = %d:\n%s", resp.status, resp.body)
	}
	if got := f.fleet.drained(); len(got) != 1 {
		t.Fatalf("the refused button changed the fleet: %v", got)
	}
}
