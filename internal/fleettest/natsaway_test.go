package fleettest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// TestForwardingWhileNATSIsAway runs two relays on a NATS server that goes
// away for several fresh windows: a request arriving at the relay without
// the device's agent is still forwarded to the relay that holds it, as the
// last directory says; and once that relay is really dead, the first one's
// watchdog alone stops the forwards to it, and the request is served by the
// agent that moved.
func TestForwardingWhileNATSIsAway(t *testing.T) {
	t.Parallel()
	natsDir := t.TempDir()
	srv, err := store.Open(context.Background(), store.Config{DataDir: natsDir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start the fleet's NATS: %v", err)
	}
	u, _ := url.Parse(srv.ClientURL())
	var back *store.Store // NATS once it returns, closed after the relays
	t.Cleanup(func() {
		if back != nil {
			back.Close()
		}
	})
	open := func(c *node.Config) {
		FastFleet(c)
		c.NATS = []string{srv.ClientURL()}
		c.AllowAnonymousUsers, c.AllowAnonymousAgents = true, true
	}
	relays := []*Relay{StartRelay(t, open), StartRelay(t, open)}
	holder, others := HolderFor(t, relays, "dev")
	entry := others[0]
	holderID := holder.Node.Fleet().ID()
	b := newBackend(t, "b1")
	StartAgent(t, holder, "dev", b.URL, "")
	waitHolder(t, relays, "dev", holder)
	c := NewClient(t, true)
	via := entry.URL + "/client/dev/echo/x"
	if code, err := Status(c, via); err != nil || code != http.StatusOK {
		t.Fatalf("before the outage: %d, %v", code, err)
	}

	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	fresh := holder.Node.Fleet().Relays()[0].LastSeenAt
	for _, r := range holder.Node.Fleet().Relays() {
		if r.ID == holderID {
			fresh = r.LastSeenAt
		}
	}
	Eventually(t, 10*time.Second, func() error {
		if age := time.Since(fresh); age < 3*time.Second {
			return fmt.Errorf("the holder's last beat is %s old", age)
		}
		if entry.Node.Fleet().Status().NATSConnected {
			return errors.New("the entry relay still reaches NATS")
		}
		return nil
	})
	if code, err := Status(c, via); err != nil || code != http.StatusOK {
		t.Errorf("NATS away for 3 fresh windows: the forward answered %d, %v; want 200", code, err)
	}

	// The holder dies: the entry relay's watchdog vetoes it, and the
	// request reaches the agent where it moved. (Its listeners close at
	// once; the rest of its Close waits for NATS, so it runs aside.)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		holder.Node.Close()
	}()
	Eventually(t, 10*time.Second, func() error {
		if !entry.Node.Vetoed(holderID) {
			return errors.New("the dead holder is not vetoed yet")
		}
		return nil
	})
	if tg, ok := entry.Node.Fleet().Route("dev", "", entry.Node.Vetoed, ""); ok && tg.ID == holderID {
		t.Errorf("with the holder vetoed, the entry relay still routes to it")
	}
	Eventually(t, 10*time.Second, func() error {
		if code, err := Status(c, via); err != nil || code != http.StatusOK {
			return fmt.Errorf("after the holder died: %d, %v", code, err)
		}
		return nil
	})

	// NATS returns on its files, which also spares the relays' cleanup the
	// drain timeout of a connection that is away.
	back, err = store.Open(context.Background(), store.Config{DataDir: natsDir, Listen: u.Host})
	if err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, func() error {
		if !entry.Node.Fleet().Status().NATSConnected {
			return errors.New("the entry relay has not reconnected")
		}
		return nil
	})
	<-closed
}
