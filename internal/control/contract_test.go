package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/fleetsecret"
	"github.com/switchboard-relay/switchboard/internal/ports"
)

// updateGolden rewrites testdata/api/*.json from the answers of this build:
// go test ./internal/control -run TestAPIContract -update. A change to a
// file is a change to the documented contract (docs/cli-json.md).
var updateGolden = flag.Bool("update", false, "rewrite the operator API's golden files")

// goldenTime is the time of everything the golden fleet holds.
var goldenTime = time.Date(2026, 3, 1, 12, 0, 3, 102938000, time.UTC)

// goldenFleet is a fleet whose every field of every answer is set, at
// fixed times, so that the operator API's JSON can be compared byte for
// byte with testdata/api.
type goldenFleet struct {
	*fakeFleet
}

func newGoldenFleet() *goldenFleet {
	t := goldenTime
	return &goldenFleet{fakeFleet: &fakeFleet{
		relays: []fleet.RelayStatus{
			{ID: "rl-00000001", Hostname: "edge-1", Region: "eu", Addresses: []string{"http://10.0.0.1:8080"},
				Version: "v1.4.0", Healthy: true, Fresh: true, LastSeenAt: t, EnrolledAt: t.Add(-time.Hour), StartedAt: t.Add(-time.Minute),
				ForwardSessions: 2, MaxForward: 512, AgentSessions: 3, AttachedDevices: 1,
				SecretFingerprint: "1f0c9a7e5b3d2c11", SecretAccepted: []string{"1f0c9a7e5b3d2c11"}, SecretSource: "fleet"},
			{ID: "rl-00000002", Hostname: "edge-2", Region: "us", Addresses: []string{},
				Version: "v1.4.0", Fresh: false, Draining: true, Stopping: true, LastSeenAt: t.Add(-time.Minute),
				MaxForward: 512, SecretAccepted: []string{}},
		},
		devices: []fleet.DeviceStatus{
			{Name: "robot-1", RelayID: "rl-00000001", AttachedAt: t, Agents: 1, Protocol: "native", Fresh: true, State: fleet.StateOnline, UpdatedAt: t, Standby: "rl-00000002"},
			{Name: "robot-2", RelayID: "rl-00000009", AttachedAt: t, Protocol: "longpoll", State: fleet.StateOffline, UpdatedAt: t},
		},
		events: []fleet.Event{
			{Seq: 4, Time: t, Type: fleet.EventRelayEnrolled, RelayID: "rl-00000001", By: "rl-00000001", Message: "relay rl-00000001 enrolled"},
			{Seq: 5, Time: t, Type: fleet.EventDeviceMoved, RelayID: "rl-00000001", From: "rl-00000002", Device: "robot-1", By: "rl-00000001", Message: "device robot-1 moved", DurationMS: 412.5},
		},
	}}
}

func (g *goldenFleet) Device(name string) (fleet.DeviceLink, error) {
	link, err := g.fakeFleet.Device(name)
	if err != nil {
		return link, err
	}
	if r, err := g.Relay(link.RelayID); err == nil {
		link.Relay = &r
	}
	return link, nil
}

func (g *goldenFleet) FollowEvents(ctx context.Context, fn func(fleet.Event) error) error {
	for _, e := range g.events {
		if err := fn(e); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

func (g *goldenFleet) RollEnabled(context.Context) (bool, error) { return true, nil }

func (g *goldenFleet) Roll(context.Context) (*fleet.RollState, error) {
	return &fleet.RollState{StartedAt: goldenTime, By: "ops@host", Order: []string{"rl-00000001", "rl-00000002"}, Done: []string{"rl-00000001"},
		Current: "rl-00000002", Phase: fleet.RollUpdating, PrevStartedAt: goldenTime.Add(-time.Hour), UpdatedAt: goldenTime}, nil
}

func (g *goldenFleet) Status() fleet.Status {
	return fleet.Status{RelayID: "rl-00000001", NATSConnected: true, LeaseHeld: true, ShouldDrain: false,
		Relays: 2, FreshRelays: 1, DrainingRelays: 1, Devices: 2, OnlineDevices: 1, DevicesHere: 1, EventsDropped: 3, ViewAgeMS: 20}
}

// goldenSecret is the fleet secret of the golden fleet.
type goldenSecret struct{}

func (goldenSecret) Report() (string, []string, string) {
	return "1f0c9a7e5b3d2c11", []string{"1f0c9a7e5b3d2c11"}, fleetsecret.SourceFleet
}

func (goldenSecret) Parity() fleetsecret.Parity {
	return fleetsecret.Parity{Expected: "8e2d4b6a0c9f7e35", Basis: fleetsecret.ParityRecord, Odd: []string{"rl-00000002"}, SigningFingerprints: 2}
}

func (g goldenSecret) Status() fleetsecret.Status {
	return fleetsecret.Status{RelayID: "rl-00000001", Source: "fleet", Record: g.record(), Parity: g.Parity(),
		Relays: []fleetsecret.RelaySecret{
			{ID: "rl-00000001", Fresh: true, SecretSource: "fleet", SecretFingerprint: "8e2d4b6a0c9f7e35", SecretAccepted: []string{"8e2d4b6a0c9f7e35", "1f0c9a7e5b3d2c11"}},
			{ID: "rl-00000002", Fresh: true, SecretSource: "file", SecretFingerprint: "0000000000000000", SecretAccepted: []string{"0000000000000000"}, Odd: true},
		}}
}

func (goldenSecret) record() *fleetsecret.RecordInfo {
	return &fleetsecret.RecordInfo{Generation: 7, Signing: "8e2d4b6a0c9f7e35",
		Secrets: []fleetsecret.SecretInfo{
			{Fingerprint: "1f0c9a7e5b3d2c11", AddedAt: goldenTime.Add(-time.Hour), RetireAt: goldenTime.Add(8 * time.Hour)},
			{Fingerprint: "8e2d4b6a0c9f7e35", AddedAt: goldenTime},
		},
		Rotation:  &fleetsecret.Rotation{Phase: fleetsecret.RotationSign, From: "1f0c9a7e5b3d2c11", To: "8e2d4b6a0c9f7e35", StartedAt: goldenTime, By: "ops@host"},
		UpdatedAt: goldenTime, UpdatedBy: "ops@host"}
}

func (g goldenSecret) BeginRotation(context.Context, string) (fleetsecret.RecordInfo, error) {
	return *g.record(), nil
}

func (g goldenSecret) SignWithNew(context.Context, string) (fleetsecret.RecordInfo, error) {
	return *g.record(), nil
}

func (g goldenSecret) FinishRotation(context.Context, string, time.Duration) (fleetsecret.RecordInfo, error) {
	rec := g.record()
	rec.Rotation = nil
	return *rec, nil
}

// TestAPIContract compares the JSON of every answer of the operator API
// with testdata/api, byte for byte: the field names and shapes that
// docs/cli-json.md documents cannot change by accident, whatever happens
// to the fleet's internal views. Each answer, decoded by the Client as ctl
// does and encoded again as 'ctl -o json' prints it, must also come out
// the same: the client's types lose no field.
func TestAPIContract(t *testing.T) {
	f := newFixture(t)
	codes := func(_ auth.Principal, device, scope string, _ time.Duration) (string, time.Time, error) {
		return "sbc1_golden", goldenTime.Add(30 * time.Second), nil
	}
	portStore := newMemPorts(
		ports.Mapping{Port: 2222, Network: ports.TCP, Target: "robot-1/ssh", Allow: []string{"192.0.2.0/24"}, MaxConns: 8, ProxyProtocol: true, CreatedAt: goldenTime, CreatedBy: "ops"},
		ports.Mapping{Port: 5353, Network: ports.UDP, Target: "robot-1/dns", CreatedAt: goldenTime},
	)
	srv := httptest.NewServer(NewHandler(Config{Tokens: f.tokens, Fleet: newGoldenFleet(), Secret: goldenSecret{},
		Codes: codes, Stop: func() {}, Ports: portStore}))
	t.Cleanup(srv.Close)
	c := &Client{BaseURL: srv.URL, Token: f.admin, HTTPClient: srv.Client()}
	userToken, _, err := f.tokens.Create(t.Context(), auth.CreateRequest{Kind: auth.KindUser, Name: "alice", Devices: []string{"robot-1"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	tests := []struct {
		name         string
		method, path string
		body         string
		token        string // "" for the admin token
		client       func() (any, error)
	}{
		{"relays", "GET", PathRelays, "", "", func() (any, error) { return c.ListRelays(ctx) }},
		{"relay", "GET", PathRelays + "/rl-00000001", "", "", nil},
		{"drain", "POST", PathRelays + "/rl-00000002/drain", "", "", func() (any, error) { return c.DrainRelay(ctx, "rl-00000002", DrainRequest{}) }},
		{"drain_check", "GET", PathRelays + "/rl-00000002/drain", "", "", func() (any, error) { return c.CheckDrain(ctx, "rl-00000002") }},
		{"undrain", "POST", PathRelays + "/rl-00000002/undrain", "", "", func() (any, error) { return c.SetRelayDraining(ctx, "rl-00000002", false) }},
		{"devices", "GET", PathDevices, "", "", func() (any, error) { return c.ListDevices(ctx) }},
		{"devices_user", "GET", PathDevices, "", userToken, nil},
		{"device", "GET", PathDevices + "/robot-1", "", "", func() (any, error) { return c.Device(ctx, "robot-1") }},
		{"device_user", "GET", PathDevices + "/robot-1", "", userToken, nil},
		{"cancel", "POST", PathDevices + "/robot-1/cancel", "", "", func() (any, error) { return c.CancelDevice(ctx, "robot-1") }},
		{"events", "GET", PathEvents + "?limit=10", "", "", func() (any, error) { return c.Events(ctx, 10) }},
		{"status", "GET", PathStatus, "", "", func() (any, error) { return c.Status(ctx) }},
		{"roll", "GET", PathRoll, "", "", func() (any, error) { return c.RollInfo(ctx) }},
		{"roll_enabled", "PUT", PathRoll + "/enabled", `{"enabled": true}`, "", nil},
		{"secret", "GET", PathSecret, "", "", func() (any, error) { return c.SecretStatus(ctx) }},
		{"rotation_begin", "POST", PathRotation, `{}`, "", func() (any, error) { return c.BeginRotation(ctx, "ops@host") }},
		{"rotation_finish", "POST", PathRotation + "/finish", `{}`, "", func() (any, error) { return c.FinishRotation(ctx, "ops@host", 0) }},
		{"token_create", "POST", PathTokens, `{"kind": "agent", "name": "arm", "devices": ["robot-1", "lab-*"]}`, "", nil},
		{"code_create", "POST", PathCodes, `{"device": "robot-1", "path": "/ui/"}`, "", func() (any, error) {
			return c.CreateCode(ctx, CodeRequest{Device: "robot-1", Path: "/ui/"})
		}},
		{"stop", "POST", PathStop, "", "", nil},
		{"ports", "GET", PathPorts, "", "", func() (any, error) { return c.ListPorts(ctx) }},
		{"port_add", "POST", PathPorts, `{"port": 6379, "target": "robot-1/redis", "allow": ["10.0.0.0/8"], "max_connections": 4}`, "", nil},
		{"port_remove", "DELETE", PathPorts + "/udp/5353", "", "", nil},
	}
	// The ids, secrets and times of these answers are new on each run: the
	// golden files hold them as placeholders.
	volatile := map[string]bool{"token_create": true, "port_add": true}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			token := tt.token
			if token == "" {
				token = f.admin
			}
			body := apiCall(t, srv, tt.method, tt.path, token, tt.body)
			if volatile[tt.name] {
				compareGolden(t, tt.name+".json", volatileValues.ReplaceAll(body, []byte(`"$1": "…"`)))
			} else {
				compareGolden(t, tt.name+".json", body)
			}
			if tt.client == nil {
				return
			}
			v, err := tt.client()
			if err != nil {
				t.Fatal(err)
			}
			var printed bytes.Buffer
			enc := json.NewEncoder(&printed)
			enc.SetIndent("", "  ")
			if err := enc.Encode(v); err != nil {
				t.Fatal(err)
			}
			if printed.String() != string(body) {
				t.Errorf("decoded by the client and printed again:\n%s\nthe relay sent:\n%s", printed.String(), body)
			}
		})
	}
	t.Run("events_follow", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+PathEvents+"?follow=1", nil)
		req.Header.Set("Authorization", "Bearer "+f.admin)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var lines bytes.Buffer
		sc := bufio.NewScanner(resp.Body)
		for range 2 {
			if !sc.Scan() {
				t.Fatalf("the stream ended: %v", sc.Err())
			}
			lines.Write(sc.Bytes())
			lines.WriteByte('\n')
		}
		compareGolden(t, "events_follow.ndjson", lines.Bytes())
	})
}

// volatileValues are the fields of an answer that differ on each run.
var volatileValues = regexp.MustCompile(`"(id|token|created_at|revoked_at)": "[^"]*"`)

// apiCall sends one request and returns the body of its 2xx answer.
func apiCall(t *testing.T, srv *httptest.Server, method, path, token, body string) []byte {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s %s", method, path, resp.Status, b.String())
	}
	return b.Bytes()
}

// compareGolden compares got with testdata/api/name, or rewrites it with -update.
func compareGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "api", name)
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestAPIContract -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the answer differs from %s, the documented contract:\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}
