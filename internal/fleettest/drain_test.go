package fleettest

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// TestOperatorDrainMovesOnlyItsDevices drains one relay of three under a
// steady load of requests through every relay: its devices move to the
// others, every other device stays where it is, and no request fails.
func TestOperatorDrainMovesOnlyItsDevices(t *testing.T) {
	relays := StartFleet(t, 3, func(c *node.Config) { c.DrainSpread = 300 * time.Millisecond })
	b := newBackend(t, "b")
	tok := FleetToken(t, relays, auth.KindAgent, "", "dev-*")
	user := FleetToken(t, relays, auth.KindUser, "u", "dev-*")
	var devices []string
	for i := range 12 {
		d := fmt.Sprintf("dev-%d", i)
		devices = append(devices, d)
		h, _ := HolderFor(t, relays, d)
		proto := agent.ProtocolNative
		if i%4 == 3 {
			proto = agent.ProtocolLongPoll
		}
		StartAgent(t, h, d, b.URL, tok, protocol(proto))
	}
	before := map[string]string{}
	Eventually(t, 10*time.Second, func() error {
		for _, d := range devices {
			e, err := relays[0].Node.Fleet().Device(d)
			if err != nil || e.Agents == 0 {
				return fmt.Errorf("%s not attached yet", d)
			}
			before[d] = e.RelayID
		}
		return nil
	})
	// Drain the relay that holds dev-0.
	drained := before["dev-0"]

	var attempted, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	c := NewClient(t, true)
	for w := range 4 {
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				entry := relays[i%len(relays)]
				req, _ := http.NewRequest(http.MethodGet, entry.URL+"/client/"+devices[i%len(devices)]+"/echo/x", nil)
				req.Header.Set("Authorization", "Bearer "+user)
				attempted.Add(1)
				resp, err := c.Do(req)
				if err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("%s via %s: %s", resp.Status, entry.Node.Fleet().ID(), body)
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	if err := relays[1].Node.Fleet().SetRelayDraining(t.Context(), drained, true); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 20*time.Second, func() error {
		for _, d := range devices {
			e, err := relays[0].Node.Fleet().Device(d)
			if err != nil {
				return err
			}
			if before[d] == drained && (e.RelayID == drained || e.Agents == 0) {
				return fmt.Errorf("%s still on the drained relay", d)
			}
		}
		return nil
	})
	close(stop)
	wg.Wait()
	for _, d := range devices {
		e, _ := relays[0].Node.Fleet().Device(d)
		if before[d] != drained && e.RelayID != before[d] {
			t.Errorf("%s moved from %s to %s, but only the drained relay's devices may move", d, before[d], e.RelayID)
		}
	}
	t.Logf("%d requests, %d failed", attempted.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d of %d requests failed during the drain; first: %v", failed.Load(), attempted.Load(), firstErr.Load())
	}
}
