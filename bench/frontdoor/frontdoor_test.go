package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
)

// TestBehindFrontDoor runs three relays behind the real nginx and the real
// HAProxy, configured as the harness configures them, with a handful of
// devices: almost no user request needs a forward hop, and after the relay
// holding the most devices is killed every one of its devices answers
// through the front door again and the load goes on. A missing nginx or
// haproxy skips its case unless SWITCHBOARD_REQUIRE_FRONTDOOR is set.
func TestBehindFrontDoor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts relay processes and a balancer")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var bin string
	for _, kind := range []string{kindNginx, kindHAProxy} {
		t.Run(kind, func(t *testing.T) {
			if _, err := frontDoorTool(kind); err != nil {
				if os.Getenv("SWITCHBOARD_REQUIRE_FRONTDOOR") != "" {
					t.Fatal(err)
				}
				t.Skip(err)
			}
			if bin == "" {
				if bin, err = benchkit.SharedBinary(); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			s, err := startSetup(ctx, bin, root, t.TempDir(), kind, options{native: 6, longpoll: 2, keepArriving: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.close()

			before := steady(ctx, s, 50, 2*time.Second)
			t.Logf("steady: %d requests, %.0f forwarded, %d failed", before.sent, before.forwards, before.failed)
			if before.failed > 0 || before.sent < 50 {
				t.Errorf("steady load: %d of %d requests failed (%s)", before.failed, before.sent, before.firstErr)
			}
			if before.share() > 0.05 {
				t.Errorf("%.0f of %d requests took a forward hop: want at most 5 %%", before.forwards, before.sent)
			}

			tr, _, err := killTrial(ctx, s, 50, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("relay %d killed with %d devices: back p50 %s, max %s; %d of %d requests failed (%s)",
				tr.relay, tr.affected, pct(tr.back, 50), pct(tr.back, 100), tr.load.failed, tr.load.sent, tr.load.firstErr)
			if tr.lost > 0 {
				t.Errorf("%d of %d devices did not answer again within %s", tr.lost, tr.affected, backWithin)
			}
			after := steady(ctx, s, 50, time.Second)
			if after.failed > 0 || after.sent == 0 {
				t.Errorf("after the kill: %d of %d requests failed (%s)", after.failed, after.sent, after.firstErr)
			}
		})
	}
}
