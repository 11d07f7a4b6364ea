package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// runCode runs 'switchboard ctl args…' as the command does and returns its
// exit code and output.
func runCode(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = Run(ctx, append([]string{"ctl"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// argumentError is a wrong command line and what ctl says of it: the whole
// last line of stderr, without the leading "switchboard: ".
type argumentError struct {
	args []string
	want string
}

// checkArgumentErrors checks, in a subtest each, that a wrong command line
// is refused as a usage error before any relay is asked: the admin URL
// leads nowhere and the token file does not exist.
func checkArgumentErrors(t *testing.T, tests []argumentError) {
	nowhere := []string{"--admin", "http://127.0.0.1:1", "--token-file", filepath.Join(t.TempDir(), "none")}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCode(context.Background(), append(nowhere, tt.args...)...)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if last := lines[len(lines)-1]; code != ExitUsage || last != "switchboard: "+tt.want {
				t.Fatalf("exit %d, last stderr line %q\nwant exit %d, %q", code, last, ExitUsage, "switchboard: "+tt.want)
			}
			if stdout != "" {
				t.Fatalf("stdout = %q, want nothing", stdout)
			}
		})
	}
}

func TestCtlFleetArgumentErrors(t *testing.T) {
	checkArgumentErrors(t, []argumentError{
		{[]string{"relays"}, "ctl relays: no command given; use list, drain or undrain"},
		{[]string{"relays", "show"}, `ctl relays: unknown command "show"; use list, drain or undrain`},
		{[]string{"relays", "list", "extra"}, `switchboard ctl relays list: unexpected argument "extra"`},
		{[]string{"relays", "drain"}, "ctl relays drain: give exactly one relay ID (see 'switchboard ctl relays list'), got 0"},
		{[]string{"relays", "undrain"}, "ctl relays undrain: give exactly one relay ID (see 'switchboard ctl relays list'), got 0"},
		{[]string{"relays", "drain", "rl-00000001", "rl-00000002"}, "ctl relays drain: give exactly one relay ID (see 'switchboard ctl relays list'), got 2"},
		{[]string{"relays", "drain", "relay-2"}, `ctl relays drain: "relay-2" is not a relay ID, which looks like rl-<8 hex digits>; see 'switchboard ctl relays list'`},
		{[]string{"relays", "undrain", "--force", "rl-00000001"}, "flag provided but not defined: -force"},
		{[]string{"relays", "undrain", "RL-0000ABCD"}, `ctl relays undrain: "RL-0000ABCD" is not a relay ID, which looks like rl-<8 hex digits>; see 'switchboard ctl relays list'`},
		{[]string{"devices"}, "ctl devices: no command given; use list, show or cancel"},
		{[]string{"devices", "remove", "robot-1"}, `ctl devices: unknown command "remove"; use list, show or cancel`},
		{[]string{"devices", "show"}, "ctl devices show: give exactly one device name (see 'switchboard ctl devices list'), got 0"},
		{[]string{"devices", "cancel"}, "ctl devices cancel: give exactly one device name (see 'switchboard ctl devices list'), got 0"},
		{[]string{"devices", "cancel", "bad/name"}, `ctl devices cancel: invalid device name "bad/name": only letters, digits, '.', '_' and '-' are allowed`},
		{[]string{"events", "--limit", "0"}, "ctl events: --limit 0: give a number from 1 to 1000"},
		{[]string{"events", "--limit", "1001", "--follow"}, "ctl events: --limit 1001: give a number from 1 to 1000"},
		{[]string{"events", "--limit", "many"}, `invalid value "many" for flag -limit: parse error`},
		{[]string{"events", "all"}, `switchboard ctl events: unexpected argument "all"`},
		{[]string{"status", "--verbose"}, "flag provided but not defined: -verbose"},
		{[]string{"roll"}, "ctl roll: give --update-cmd, the command that updates one relay (see docs/operations.md)"},
		{[]string{"roll", "enable", "extra"}, `switchboard ctl roll: unexpected argument "extra"`},
		{[]string{"relays", "list", "-o", "yaml"}, `-o "yaml": use table or json`},
	})
}

// fakeFleet is the fleet state behind a real operator API handler: what it
// answers is set by the test.
type fakeFleet struct {
	mu       sync.Mutex // guards the fields below
	relays   []fleet.RelayStatus
	devices  []fleet.DeviceStatus
	events   []fleet.Event
	draining map[string]bool

	stream chan fleet.Event // what FollowEvents delivers
	// endStream makes FollowEvents return at once, as a relay stopping does.
	endStream bool
}

var _ control.Fleet = (*fakeFleet)(nil)

func (f *fakeFleet) Relays() []fleet.RelayStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.relays)
}

func (f *fakeFleet) Relay(id string) (fleet.RelayStatus, error) {
	for _, r := range f.Relays() {
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
	if _, err := f.Relay(id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.draining[id] = draining
	return nil
}

func (f *fakeFleet) Devices() []fleet.DeviceStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.devices)
}

func (f *fakeFleet) Device(name string) (fleet.DeviceLink, error) {
	for _, d := range f.Devices() {
		if d.Name == name {
			link := fleet.DeviceLink{DeviceStatus: d}
			if r, err := f.Relay(d.RelayID); err == nil {
				link.Relay = &r
			}
			return link, nil
		}
	}
	return fleet.DeviceLink{}, fmt.Errorf("device %q: %w", name, fleet.ErrNotFound)
}

func (f *fakeFleet) Events(_ context.Context, n int) ([]fleet.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events[max(0, len(f.events)-n):]), nil
}

func (f *fakeFleet) addEvents(es ...fleet.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, es...)
}

func (f *fakeFleet) FollowEvents(ctx context.Context, fn func(fleet.Event) error) error {
	f.mu.Lock()
	end := f.endStream
	f.mu.Unlock()
	if end {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-f.stream:
			if err := fn(e); err != nil {
				return err
			}
		}
	}
}

func (f *fakeFleet) RollEnabled(context.Context) (bool, error)          { return false, nil }
func (f *fakeFleet) SetRollEnabled(context.Context, bool) error         { return nil }
func (f *fakeFleet) Roll(context.Context) (*fleet.RollState, error)     { return nil, nil }
func (f *fakeFleet) SaveRoll(context.Context, fleet.RollState) error    { return nil }
func (f *fakeFleet) ClearRoll(context.Context) error                    { return nil }
func (f *fakeFleet) CancelDevice(context.Context, string, string) error { return nil }

func (f *fakeFleet) Status() fleet.Status {
	return fleet.Status{RelayID: "rl-0000000a", NATSConnected: true, LeaseHeld: true, Relays: 2, FreshRelays: 1, DrainingRelays: 1, Devices: 3, OnlineDevices: 2}
}

// fakeFleetFixture serves the operator API over a fakeFleet, with the
// token store of a ctlFixture.
func fakeFleetFixture(t *testing.T) (*ctlFixture, *fakeFleet) {
	t.Helper()
	f, ff := newCtlFixture(t), newFakeFleet()
	f.serveFleet(t, ff)
	return f, ff
}

// serveFleet points f at a new operator API handler over fl, with f's
// token store.
func (f *ctlFixture) serveFleet(t *testing.T, fl control.Fleet) {
	srv := httptest.NewServer(control.NewHandler(control.Config{Tokens: f.tokens, Fleet: fl}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
}

// newFakeFleet returns a fakeFleet of two relays and three devices.
func newFakeFleet() *fakeFleet {
	seen := time.Now().Add(-3*time.Minute - 30*time.Second)
	return &fakeFleet{
		relays: []fleet.RelayStatus{
			{ID: "rl-0000000a", Hostname: "edge-a", Region: "eu", Addresses: []string{"http://10.0.0.1:8080"}, Version: "v1.2.0",
				Healthy: true, Fresh: true, LastSeenAt: seen, ForwardSessions: 2, MaxForward: 512, AttachedDevices: 2},
			{ID: "rl-0000000b", Hostname: "edge-b", Addresses: []string{}, Version: "v1.2.0",
				Draining: true, Stopping: true, LastSeenAt: seen.Add(-10 * time.Hour), MaxForward: 512},
		},
		devices: []fleet.DeviceStatus{
			{Name: "robot-1", RelayID: "rl-0000000a", AttachedAt: seen, Agents: 1, Protocol: "native", Fresh: true, State: fleet.StateOnline, UpdatedAt: seen},
			{Name: "robot-2", RelayID: "rl-0000000f", AttachedAt: seen, Agents: 1, Protocol: "longpoll", State: fleet.StateStale, UpdatedAt: seen},
			{Name: "robot-3", State: fleet.StateOffline},
		},
		draining: map[string]bool{},
		stream:   make(chan fleet.Event),
	}
}

func TestCtlRelays(t *testing.T) {
	f, ff := fakeFleetFixture(t)

	table, _ := f.mustCtl(t, "relays", "list")
	lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("table =\n%s\nwant a header and two relays", table)
	}
	for _, want := range []string{"ID", "HOSTNAME", "REGION", "ADDRESSES", "VERSION", "HEALTHY", "FRESH", "DRAINING", "LAST SEEN", "SESSIONS", "DEVICES"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("header %q lacks %s", lines[0], want)
		}
	}
	for i, want := range [][]string{
		{"rl-0000000a", "edge-a", "eu", "http://10.0.0.1:8080", "v1.2.0", "yes", "yes", "no", "3m ago", "2/512", "2"},
		{"rl-0000000b", "edge-b", "-", "-", "v1.2.0", "no", "no", "yes, stopping", "10h ago", "0/512", "0"},
	} {
		if got := columns(lines[i+1]); !slices.Equal(got, want) {
			t.Errorf("row %d = %q, want %q", i+1, got, want)
		}
	}
	if col := strings.Index(lines[0], "DRAINING"); lines[1][col-1] != ' ' || lines[2][col-1] != ' ' {
		t.Errorf("columns not aligned:\n%s", table)
	}

	js, _ := f.mustCtl(t, "relays", "list", "-o", "json")
	var raw []map[string]any
	if err := json.Unmarshal([]byte(js), &raw); err != nil || len(raw) != 2 {
		t.Fatalf("relays list -o json = %s (%v)", js, err)
	}
	for _, field := range []string{"id", "hostname", "region", "addresses", "version", "healthy", "fresh", "draining", "stopping",
		"last_seen_at", "enrolled_at", "forward_sessions", "max_forward", "agent_sessions", "attached_devices"} {
		if _, ok := raw[0][field]; !ok {
			t.Errorf("relays list -o json lacks %q: %s", field, js)
		}
	}
	if addrs, ok := raw[1]["addresses"].([]any); !ok || len(addrs) != 0 {
		t.Errorf("addresses of a relay without any = %v, want []", raw[1]["addresses"])
	}

	// The other relay is stale: rl-0000000a is the last relay serving.
	if _, _, err := f.ctl(t, "relays", "drain", "rl-0000000a"); err == nil || !strings.Contains(err.Error(), "409 Conflict: relay rl-0000000a is the last relay serving") {
		t.Errorf("drain of the last relay serving: %v", err)
	}
	out, _ := f.mustCtl(t, "relays", "drain", "--force", "rl-0000000a")
	if out != "relay rl-0000000a is draining, but no other relay is serving: it keeps its 2 devices and still takes new devices, as there is nowhere else for them, until another relay serves\n" {
		t.Errorf("drain --force printed %q", out)
	}
	out, _ = f.mustCtl(t, "-o", "json", "relays", "undrain", "rl-0000000a")
	if out != "{\n  \"id\": \"rl-0000000a\",\n  \"draining\": false\n}\n" {
		t.Errorf("undrain -o json printed %q", out)
	}
	out, _ = f.mustCtl(t, "relays", "undrain", "rl-0000000a")
	if out != "relay rl-0000000a is no longer draining\n" {
		t.Errorf("undrain printed %q", out)
	}
	ff.mu.Lock()
	drained, known := ff.draining["rl-0000000a"]
	ff.mu.Unlock()
	if !known || drained {
		t.Errorf("the relay's drain flag = %v (set: %v), want false", drained, known)
	}

	code, stdout, stderr := runCode(context.Background(), "--admin", f.url, "--token-file", f.tokenFile, "relays", "drain", "rl-12345678")
	want := "switchboard: ctl relays drain: relay rl-12345678 is not in the fleet; see 'switchboard ctl relays list'\n"
	if code != ExitFailure || stderr != want || stdout != "" {
		t.Errorf("drain unknown: exit %d, stdout %q, stderr %q; want exit %d, stderr %q", code, stdout, stderr, ExitFailure, want)
	}
	_, _, err := f.ctl(t, "relays", "drain", "rl-12345678")
	var apiErr *control.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("drain unknown = %v, want it to wrap the *APIError 404", err)
	}
}

func TestCtlDevices(t *testing.T) {
	f, _ := fakeFleetFixture(t)

	table, _ := f.mustCtl(t, "devices", "list")
	want := [][]string{
		{"NAME", "RELAY", "STATE", "AGENTS", "PROTOCOL", "ATTACHED"},
		{"robot-1", "rl-0000000a", "online", "1", "native", "3m ago"},
		{"robot-2", "rl-0000000f", "stale", "1", "longpoll", "3m ago"},
		{"robot-3", "-", "offline", "0", "-", "-"},
	}
	lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("table =\n%s", table)
	}
	for i := range want {
		if got := columns(lines[i]); !slices.Equal(got, want[i]) {
			t.Errorf("line %d = %q, want %q", i, lines[i], want[i])
		}
	}

	js, _ := f.mustCtl(t, "devices", "list", "-o", "json")
	var list []map[string]any
	if err := json.Unmarshal([]byte(js), &list); err != nil || len(list) != 3 {
		t.Fatalf("devices list -o json = %s (%v)", js, err)
	}
	for _, field := range []string{"name", "relay_id", "attached_at", "agents", "protocol", "fresh", "state", "updated_at"} {
		if _, ok := list[0][field]; !ok {
			t.Errorf("devices list -o json lacks %q", field)
		}
	}

	block, _ := f.mustCtl(t, "devices", "show", "robot-1")
	squeezed := columnGap.ReplaceAllString(block, " ")
	for _, want := range []string{"device robot-1\n", "state online\n", "agents 1\n", "protocol native\n", "attached 20", " (3m ago)\n",
		"relay rl-0000000a\n", " hostname edge-a\n", " region eu\n", " addresses http://10.0.0.1:8080\n", " fresh yes (last seen 3m ago)\n", " draining no\n"} {
		if !strings.Contains(squeezed, want) {
			t.Errorf("devices show = \n%s\nlacks %q", block, want)
		}
	}
	block, _ = f.mustCtl(t, "devices", "show", "robot-2")
	if !strings.Contains(columnGap.ReplaceAllString(block, " "), "relay rl-0000000f (no longer in the fleet)\n") {
		t.Errorf("devices show of a device on a reaped relay =\n%s", block)
	}
	js, _ = f.mustCtl(t, "devices", "show", "robot-1", "-o", "json")
	var link control.DeviceLink
	if err := json.Unmarshal([]byte(js), &link); err != nil || link.Name != "robot-1" || link.Relay == nil || link.Relay.Hostname != "edge-a" {
		t.Errorf("devices show -o json = %s (%v)", js, err)
	}

	code, _, stderr := runCode(context.Background(), "--admin", f.url, "--token-file", f.tokenFile, "devices", "show", "robot-9")
	if want := "switchboard: ctl devices show: device \"robot-9\" is not in the fleet; see 'switchboard ctl devices list'\n"; code != ExitFailure || stderr != want {
		t.Errorf("show unknown: exit %d, stderr %q; want %d, %q", code, stderr, ExitFailure, want)
	}
}

func TestCtlStatus(t *testing.T) {
	f, _ := fakeFleetFixture(t)
	out, _ := f.mustCtl(t, "status")
	want := "relay               rl-0000000a\n" +
		"nats                connected\n" +
		"housekeeping lease  held by this relay\n" +
		"draining            no\n" +
		"relays              2 (1 fresh, 1 draining)\n" +
		"devices             3 (2 online)\n" +
		"events dropped      0\n"
	if out != want {
		t.Errorf("status =\n%s\nwant\n%s", out, want)
	}
	js, _ := f.mustCtl(t, "status", "-o", "json")
	var st control.Status
	if err := json.Unmarshal([]byte(js), &st); err != nil || st.Relays != 2 || st.RelayID != "rl-0000000a" || !st.LeaseHeld {
		t.Errorf("status -o json = %s (%v)", js, err)
	}
}

func event(seq uint64, typ, relay, msg string) fleet.Event {
	return fleet.Event{Seq: seq, Time: time.Date(2026, 3, 1, 12, 0, int(seq), 0, time.UTC), Type: typ, RelayID: relay, Message: msg}
}

func TestCtlEvents(t *testing.T) {
	f, ff := fakeFleetFixture(t)
	ff.addEvents(
		event(1, fleet.EventRelayEnrolled, "rl-0000000a", "relay enrolled"),
		event(2, fleet.EventLeaseTaken, "rl-0000000a", "lease taken"),
		fleet.Event{Seq: 3, Time: time.Date(2026, 3, 1, 12, 0, 3, 0, time.UTC), Type: fleet.EventDeviceAttached, RelayID: "rl-0000000a", Device: "robot-1", Message: "attached"},
	)
	out, _ := f.mustCtl(t, "events", "--limit", "2")
	want := "TIME                  TYPE                RELAY        DEVICE            MESSAGE\n" +
		"2026-03-01T12:00:02Z  housekeeping.lease  rl-0000000a  -                 lease taken\n" +
		"2026-03-01T12:00:03Z  device.attached     rl-0000000a  robot-1           attached\n"
	if out != want {
		t.Errorf("events --limit 2 =\n%s\nwant\n%s", out, want)
	}
	js, _ := f.mustCtl(t, "events", "-o", "json")
	var evs []control.Event
	if err := json.Unmarshal([]byte(js), &evs); err != nil || len(evs) != 3 || evs[0].Type != fleet.EventRelayEnrolled {
		t.Errorf("events -o json = %s (%v)", js, err)
	}
}

// waitOutput polls until out holds want, failing the test after 5 s.
func waitOutput(t *testing.T, out *testkit.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output never held %q; it is:\n%s", want, out.String())
		}
		<-tick.C
	}
}

// columns splits a table row at runs of two or more spaces.
func columns(row string) []string { return columnGap.Split(strings.TrimSpace(row), -1) }

var columnGap = regexp.MustCompile(` {2,}`)

// TestCtlEventsFollow checks that --follow prints the last events, then new
// ones once each, fills in those the stream started too late for, and ends
// with success when interrupted.
func TestCtlEventsFollow(t *testing.T) {
	f, ff := fakeFleetFixture(t)
	ff.addEvents(event(1, fleet.EventRelayEnrolled, "rl-0000000a", "one"), event(2, fleet.EventRelayEnrolled, "rl-0000000b", "two"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut testkit.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runCtl(ctx, []string{"--admin", f.url, "--token-file", f.tokenFile, "-o", "json", "events", "--follow"}, &out, &errOut)
	}()
	waitOutput(t, &out, `"message":"two"`)

	// Event 2 again (the stream began before the list was read), then 5:
	// 3 and 4 happened while the stream was being set up.
	ff.addEvents(event(3, fleet.EventRelayDraining, "rl-0000000a", "three"), event(4, fleet.EventRelayUndrained, "rl-0000000a", "four"),
		event(5, fleet.EventRelayStale, "rl-0000000b", "five"))
	ff.stream <- event(2, fleet.EventRelayEnrolled, "rl-0000000b", "two")
	ff.stream <- event(5, fleet.EventRelayStale, "rl-0000000b", "five")
	ff.stream <- event(6, fleet.EventRelayFresh, "rl-0000000b", "six")
	waitOutput(t, &out, `"message":"six"`)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("interrupted follow = %v, want nil; stderr %s", err, errOut.String())
	}

	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	var msgs []string
	for _, l := range lines {
		var e control.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %q is not one JSON event: %v", l, err)
		}
		msgs = append(msgs, e.Message)
	}
	if want := []string{"one", "two", "three", "four", "five", "six"}; !slices.Equal(msgs, want) {
		t.Fatalf("followed events = %q, want %q", msgs, want)
	}
}

// TestCtlEventsFollowFromEmptyLog checks that events recorded after an empty
// log was read, but before the stream began, are printed too.
func TestCtlEventsFollowFromEmptyLog(t *testing.T) {
	f, ff := fakeFleetFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut testkit.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runCtl(ctx, []string{"--admin", f.url, "--token-file", f.tokenFile, "events", "--follow"}, &out, &errOut)
	}()
	waitOutput(t, &out, "MESSAGE\n")
	ff.addEvents(event(1, fleet.EventRelayEnrolled, "rl-0000000a", "one"), event(2, fleet.EventRelayFresh, "rl-0000000a", "two"))
	ff.stream <- event(2, fleet.EventRelayFresh, "rl-0000000a", "two")
	waitOutput(t, &out, " two\n")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("interrupted follow = %v, want nil; stderr %s", err, errOut.String())
	}
	want := "TIME                  TYPE                RELAY        DEVICE            MESSAGE\n" +
		"2026-03-01T12:00:01Z  relay.enrolled      rl-0000000a  -                 one\n" +
		"2026-03-01T12:00:02Z  relay.fresh         rl-0000000a  -                 two\n"
	if got := out.String(); got != want {
		t.Fatalf("stdout =\n%s\nwant\n%s", got, want)
	}
}

func TestCtlEventsFollowTableAndStreamEnd(t *testing.T) {
	f, ff := fakeFleetFixture(t)
	ff.addEvents(event(1, fleet.EventRelayEnrolled, "rl-0000000a", "one"))
	ff.mu.Lock()
	ff.endStream = true // the relay stops
	ff.mu.Unlock()
	stdout, stderr, err := f.ctl(t, "events", "--follow")
	if err == nil || !strings.Contains(err.Error(), "ctl events --follow:") {
		t.Fatalf("follow of a stream that ends = %v, want an error; stderr %s", err, stderr)
	}
	want := "TIME                  TYPE                RELAY        DEVICE            MESSAGE\n" +
		"2026-03-01T12:00:01Z  relay.enrolled      rl-0000000a  -                 one\n"
	if stdout != want {
		t.Fatalf("stdout =\n%s\nwant\n%s", stdout, want)
	}

	// Interrupted before anything was printed: still a success.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if code, _, stderr := runCode(ctx, "--admin", f.url, "--token-file", f.tokenFile, "events", "--follow"); code != ExitOK {
		t.Fatalf("follow interrupted at once: exit %d, stderr %q", code, stderr)
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		ago  time.Duration
		want string
	}{
		{-time.Second, "just now"}, // a clock a little ahead
		{300 * time.Millisecond, "just now"},
		{3 * time.Second, "3s ago"},
		{59*time.Second + 900*time.Millisecond, "59s ago"},
		{2 * time.Minute, "2m ago"},
		{5 * time.Hour, "5h ago"},
		{47 * time.Hour, "47h ago"},
		{72 * time.Hour, "3d ago"},
	}
	for _, tt := range tests {
		if got := age(now.Add(-tt.ago), now); got != tt.want {
			t.Errorf("age(%v) = %q, want %q", tt.ago, got, tt.want)
		}
	}
	if got := age(time.Time{}, now); got != "-" {
		t.Errorf("age(zero) = %q, want -", got)
	}
}
