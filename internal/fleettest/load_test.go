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
)

// steadyLoad sends GET requests for devices, one after another per worker,
// through the relay entry picks (nil: skip, as a balancer whose health
// check took the relay out), and counts the ones that fail.
type steadyLoad struct {
	attempted, failed atomic.Int64
	firstErr          atomic.Value
	stop              chan struct{}
	wg                sync.WaitGroup
	once              sync.Once
}

func startLoad(t *testing.T, workers int, user string, devices []string, entry func(i int) *Relay) *steadyLoad {
	l := &steadyLoad{stop: make(chan struct{})}
	c := NewClient(t, false)
	for w := range workers {
		l.wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				r := entry(i)
				if r == nil {
					continue
				}
				req, _ := http.NewRequest(http.MethodGet, r.URL+"/client/"+devices[i%len(devices)]+"/echo/load", nil)
				req.Header.Set("Authorization", "Bearer "+user)
				l.attempted.Add(1)
				began := time.Now()
				resp, err := c.Do(req)
				if err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("%s via %s: %s", resp.Status, r.URL, body)
					}
				}
				if err != nil {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, fmt.Sprintf("%v (after %s, at %s)", err, time.Since(began).Round(time.Millisecond), time.Now().Format("15:04:05.000")))
				}
			}
		})
	}
	t.Cleanup(l.halt)
	return l
}

func (l *steadyLoad) halt() {
	l.once.Do(func() {
		close(l.stop)
		l.wg.Wait()
	})
}

// check stops the load and fails the test if any request failed.
func (l *steadyLoad) check(t *testing.T) {
	t.Helper()
	l.halt()
	t.Logf("%d requests, %d failed", l.attempted.Load(), l.failed.Load())
	if l.failed.Load() != 0 {
		t.Errorf("%d of %d requests failed; first: %v", l.failed.Load(), l.attempted.Load(), l.firstErr.Load())
	}
}

// knowsAll lets an agent know every relay of the fleet, first the one it
// was started against, as agents behind a load balancer do. Long-poll
// agents, which no relay can send elsewhere, need it to follow a drain.
func knowsAll(t *testing.T, relays []*Relay) func(*agent.Config) {
	return func(c *agent.Config) {
		for _, r := range relays {
			u := mustParse(t, r.URL)
			if u.String() != c.Relays[0].String() {
				c.Relays = append(c.Relays, u)
			}
		}
	}
}
