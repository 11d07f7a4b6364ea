package auth

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestRevocationArrivesAfterTheWatchEnds ends the token store's watch from
// outside, without touching NATS, as nats.go ends a watch whose consumer
// it gave up, and keeps it from starting again while another relay revokes
// one token and another token's record is deleted. Once watches may start
// again, the store reads the bucket whole: it refuses both tokens, calls
// OnRevoke once for each and for nothing else, and accepts a token created
// meanwhile. (The store used to stop following the bucket when its watch
// ended, and accepted revoked tokens until it was restarted.)
func TestRevocationArrivesAfterTheWatchEnds(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	st := openNATS(t, store.Config{})
	kv, err := st.KeyValue(ctx, Bucket)
	if err != nil {
		t.Fatal(err)
	}
	tap := testkit.NewKVTap(kv)
	here, err := Open(ctx, tap, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { here.Close() })
	var mu sync.Mutex // guards fired
	var fired []string
	here.OnRevoke(func(id string) {
		mu.Lock()
		defer mu.Unlock()
		fired = append(fired, id)
	})
	other := openTokens(t, st) // another relay of the fleet

	revokedSecret, revoked := mustCreate(t, other, CreateRequest{Kind: KindUser, Name: "revoked"})
	deletedSecret, deleted := mustCreate(t, other, CreateRequest{Kind: KindAgent, Devices: []string{"d"}})
	keptSecret, _ := mustCreate(t, other, CreateRequest{Kind: KindUser, Name: "kept"})
	eventually(t, 5*time.Second, func() error {
		for _, secret := range []string{revokedSecret, deletedSecret, keptSecret} {
			if _, err := here.Authenticate(secret); err != nil {
				return err
			}
		}
		return nil
	})

	tap.EndWatches()
	if err := other.Revoke(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, deleted.ID); err != nil {
		t.Fatal(err)
	}
	newSecret, _ := mustCreate(t, other, CreateRequest{Kind: KindUser, Name: "created meanwhile"})
	if _, err := here.Authenticate(revokedSecret); err != nil {
		t.Fatalf("the store learnt of the revocation while it had no watch: %v", err)
	}

	tap.Release()
	start := time.Now()
	eventually(t, 3*time.Second, func() error {
		for name, secret := range map[string]string{"revoked": revokedSecret, "deleted": deletedSecret} {
			if _, err := here.Authenticate(secret); !errors.Is(err, ErrInvalidToken) {
				return fmt.Errorf("the %s token gives %v, want ErrInvalidToken", name, err)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(fired) < 2 {
			return fmt.Errorf("OnRevoke saw %v", fired)
		}
		return nil
	})
	t.Logf("revocations applied %v after watches could start again", time.Since(start))
	for name, secret := range map[string]string{"kept": keptSecret, "new": newSecret} {
		if _, err := here.Authenticate(secret); err != nil {
			t.Errorf("the %s token gives %v after the full read", name, err)
		}
	}
	mu.Lock()
	got := slices.Sorted(slices.Values(fired))
	mu.Unlock()
	if want := slices.Sorted(slices.Values([]string{revoked.ID, deleted.ID})); !slices.Equal(got, want) {
		t.Errorf("OnRevoke saw %v, want %v once each", got, want)
	}
	if n := tap.Started(); n < 2 {
		t.Errorf("%d watches started, want a second one", n)
	}
}

// TestResyncAfterNATSLostItsFiles: NATS comes back on its address without
// its files, and a relay starting against it makes the token bucket anew.
// A relay that resyncs its token store on reconnect, as every relay does,
// forgets the tokens that went with the files, cutting what they let in,
// and accepts the tokens made since.
func TestResyncAfterNATSLostItsFiles(t *testing.T) {
	t.Parallel()
	first, err := store.Open(testContext(t), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })
	addr := first.ClientURL()
	relay := openNATS(t, store.Config{URLs: []string{addr}})
	here := openTokens(t, relay)
	relay.OnReconnect(here.Resync)
	fired := make(chan string, 4)
	here.OnRevoke(func(id string) { fired <- id })
	lostSecret, lost := mustCreate(t, here, CreateRequest{Kind: KindUser, Name: "lost with the files"})

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := openNATS(t, store.Config{DataDir: t.TempDir(), Listen: addr[len("nats://"):]})
	newSecret, _ := mustCreate(t, openTokens(t, second), CreateRequest{Kind: KindUser, Name: "made since"})

	eventually(t, 10*time.Second, func() error {
		if _, err := here.Authenticate(lostSecret); !errors.Is(err, ErrInvalidToken) {
			return fmt.Errorf("the lost token gives %v", err)
		}
		if _, err := here.Authenticate(newSecret); err != nil {
			return fmt.Errorf("the new token gives %v", err)
		}
		return nil
	})
	select {
	case id := <-fired:
		if id != lost.ID {
			t.Fatalf("OnRevoke(%s), want %s", id, lost.ID)
		}
	default:
		t.Fatal("OnRevoke was not called for the lost token")
	}
}
