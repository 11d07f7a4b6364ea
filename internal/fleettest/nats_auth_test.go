package fleettest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// TestFleetSharesPasswordProtectedEmbeddedNATS: one relay's embedded NATS
// accepts the fleet and demands a password; a relay that has it joins and
// shares the fleet state, one with a wrong password or none cannot start.
func TestFleetSharesPasswordProtectedEmbeddedNATS(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "nats.password")
	if err := os.WriteFile(pwFile, []byte("fleet-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds := store.Credentials{User: "relay", PasswordFile: pwFile}
	hub := StartRelay(t, FastFleet, func(c *node.Config) {
		c.NATSListen = "127.0.0.1:0"
		c.NATSCredentials = creds
	})
	natsURL := hub.Node.NATSURL()
	if natsURL == "" {
		t.Fatal("the hub's embedded NATS does not listen")
	}
	peer := StartRelay(t, FastFleet, func(c *node.Config) {
		c.NATS = []string{natsURL}
		c.NATSCredentials = creds
	})

	relays := []*Relay{hub, peer}
	HolderFor(t, relays, "robot-1")                       // each sees the other's heartbeats
	FleetToken(t, relays, auth.KindUser, "me", "robot-1") // a token made on the hub reaches the peer

	for name, wrong := range map[string]store.Credentials{
		"wrong password": {User: "relay", Password: "not-the-password"},
		"no credentials": {},
	} {
		t.Run(name, func(t *testing.T) {
			n, err := node.Start(context.Background(), node.Config{
				Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: t.TempDir(),
				NATS: []string{natsURL}, NATSCredentials: wrong,
			})
			if err == nil {
				n.Close()
				t.Fatal("a relay with wrong NATS credentials started")
			}
			if !errors.Is(err, store.ErrAuthFailed) {
				t.Fatalf("Start = %v, want store.ErrAuthFailed", err)
			}
		})
	}
}
