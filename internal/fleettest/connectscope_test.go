package fleettest

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/control"
)

// codeClient returns a connect client of relay r with an access code.
func codeClient(t *testing.T, r *Relay, code string) *connect.Client {
	u, err := url.Parse(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := connect.NewClient(connect.ClientConfig{Relay: u, Code: code})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestConnectScopedCredentials: a user token may name a device's services
// (DEVICE/SERVICE) and then reaches those alone, through connect and
// nowhere else of the device; an access code opens a connect session to
// the services under its scope, once.
func TestConnectScopedCredentials(t *testing.T) {
	relays := StartFleet(t, 2)
	holder, others := HolderFor(t, relays, "robot")
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "echo=tcp://"+echoService(t), "db=tcp://"+echoService(t)))
	holder.WaitDevice(t, "robot")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	scoped := FleetToken(t, relays, auth.KindUser, "alice", "robot/echo", "lab-*/db")

	for _, r := range []*Relay{holder, others[0]} {
		c := connectClient(t, r, scoped)
		if got, conn, err := echoOnce(ctx, c, "robot/echo", "in scope"); err != nil || got != "in scope" {
			t.Fatalf("robot/echo with a token for it: %q, %v", got, err)
		} else {
			conn.Close()
		}
		for _, target := range []string{"robot/db", "lab-1/echo"} {
			if _, _, err := echoOnce(ctx, c, target, "x"); !errors.Is(err, connect.ErrForbidden) {
				t.Errorf("%s with a token for robot/echo and lab-*/db: %v, want ErrForbidden", target, err)
			}
		}
		// The device's HTTP backend is not one of its services.
		if code, _, _ := get(t, r.URL+"/client/robot/", "Authorization", "Bearer "+scoped); code != http.StatusForbidden {
			t.Errorf("HTTP to robot with a token for robot/echo: %d, want 403", code)
		}
	}

	// The scoped entry is checked where tokens are made.
	admin := &control.Client{BaseURL: holder.AdminURL, Token: holder.AdminToken}
	for _, req := range []control.TokenRequest{
		{Kind: auth.KindUser, Name: "bob", Devices: []string{"robot/Not--A-Service"}},
		{Kind: auth.KindAgent, Devices: []string{"robot/echo"}},
	} {
		_, err := admin.CreateToken(ctx, req)
		if apiErr, ok := errors.AsType[*control.APIError](err); !ok || apiErr.Status != http.StatusBadRequest {
			t.Errorf("a token for %v (%s): %v, want 400", req.Devices, req.Kind, err)
		}
	}

	// Access codes: the code's scope, once.
	user := FleetToken(t, relays, auth.KindUser, "carol", "robot")
	code := issueCode(t, others[0], user, "robot", "/.service/echo")
	c := codeClient(t, others[0], code.Code)
	if got, conn, err := echoOnce(ctx, c, "robot/echo", "by code"); err != nil || got != "by code" {
		t.Fatalf("robot/echo with a code for /.service/echo: %q, %v", got, err)
	} else {
		conn.Close()
	}
	if _, _, err := echoOnce(ctx, c, "robot/db", "x"); !errors.Is(err, connect.ErrForbidden) {
		t.Errorf("robot/db with a code for /.service/echo: %v, want ErrForbidden", err)
	}
	for _, r := range relays {
		_, _, err := echoOnce(ctx, codeClient(t, r, code.Code), "robot/echo", "again")
		if he, ok := errors.AsType[*connect.HandshakeError](err); !ok || he.Status != http.StatusUnauthorized {
			t.Errorf("the code used again: %v, want 401", err)
		}
	}
	page := issueCode(t, holder, user, "robot", "/ui/")
	_, _, err := echoOnce(ctx, codeClient(t, holder, page.Code), "robot/echo", "x")
	if he, ok := errors.AsType[*connect.HandshakeError](err); !ok || he.Status != http.StatusForbidden {
		t.Errorf("a code for /ui/ on connect: %v, want 403", err)
	}
	all := issueCode(t, holder, user, "robot", "/")
	c = codeClient(t, holder, all.Code)
	for _, target := range []string{"robot/echo", "robot/db"} {
		if got, conn, err := echoOnce(ctx, c, target, "all"); err != nil || got != "all" {
			t.Errorf("%s with a code for /: %q, %v", target, got, err)
		} else {
			conn.Close()
		}
	}
	// A token scoped to a service hands out codes for that service alone.
	cl := &control.Client{BaseURL: holder.AdminURL, Token: scoped}
	if _, err := cl.CreateCode(ctx, control.CodeRequest{Device: "robot", Path: "/"}); err == nil {
		t.Error("a token for robot/echo issued a code for all of robot")
	}
	if _, err := cl.CreateCode(ctx, control.CodeRequest{Device: "robot", Path: "/.service/echo"}); err != nil {
		t.Errorf("a token for robot/echo could not issue a code for it: %v", err)
	}
}
