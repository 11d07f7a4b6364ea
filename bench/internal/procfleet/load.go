package procfleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Load sends a steady stream of requests, one every interval, each to the
// next device through the next relay that is up (as a load balancer whose
// health check removed a dead relay at once would), alternating GET and
// POST. It counts them by kind: idempotent or not, and forwarded (the entry
// relay is not the device's holder as last snapshot, see SetHolders) or
// not; and apart, the failures of requests whose entry relay went down
// while they were in flight, which no relay can mend.
type Load struct {
	cancel  context.CancelFunc
	done    chan struct{}
	holders atomic.Pointer[map[string]string] // device → relay id, see SetHolders
	tallies [2][2]tally                       // [post][forwarded]
	lost    [2]atomic.Int64                   // [post]: failed with their entry relay
	first   [2]atomic.Pointer[string]         // [post]: the first failure through a relay that stayed up
}

// tally counts requests of one kind.
type tally struct{ attempted, failed atomic.Int64 }

// StartLoad starts the load over relays (those that join later take none)
// and devices, until Stop.
func StartLoad(ctx context.Context, relays []*Relay, devices []string, every time.Duration) *Load {
	ctx, cancel := context.WithCancel(ctx)
	l := &Load{cancel: cancel, done: make(chan struct{})}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	relays = slices.Clone(relays)
	go func() {
		defer close(l.done)
		defer c.CloseIdleConnections()
		tick := time.NewTicker(every)
		defer tick.Stop()
		var wg sync.WaitGroup
		defer wg.Wait()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			r := nextUp(relays, i)
			if r == nil {
				continue
			}
			d, post := devices[i%len(devices)], i%2 == 1
			forwarded := 0
			if h := l.holders.Load(); h != nil && (*h)[d] != "" && (*h)[d] != r.ID {
				forwarded = 1
			}
			downs := r.Downs()
			wg.Go(func() {
				err := request(ctx, c, r.URL()+"/client/"+d+"/", post)
				if ctx.Err() != nil {
					return
				}
				t := &l.tallies[b2i(post)][forwarded]
				t.attempted.Add(1)
				if err == nil {
					return
				}
				t.failed.Add(1)
				if r.Downs() != downs {
					l.lost[b2i(post)].Add(1)
					return
				}
				msg := fmt.Sprintf("%s via relay %d: %v", d, r.N, err)
				l.first[b2i(post)].CompareAndSwap(nil, &msg)
			})
		}
	}()
	return l
}

// nextUp returns the relay to send request i through: the i-th of relays,
// or the next one that is up; nil when none is.
func nextUp(relays []*Relay, i int) *Relay {
	for k := range relays {
		if r := relays[(i+k)%len(relays)]; r.Up() {
			return r
		}
	}
	return nil
}

// request sends one GET, or one POST with a small body, and wants a 200.
func request(ctx context.Context, c *http.Client, u string, post bool) error {
	method, body := http.MethodGet, io.Reader(nil)
	if post {
		method, body = http.MethodPost, strings.NewReader(`{"n":1}`)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SetHolders snapshots where each device is (device → relay id), so that
// requests are counted as forwarded or not.
func (l *Load) SetHolders(dir map[string]string) { l.holders.Store(&dir) }

// Reset starts the counts again.
func (l *Load) Reset() {
	for i := range l.tallies {
		for j := range l.tallies[i] {
			l.tallies[i][j].attempted.Store(0)
			l.tallies[i][j].failed.Store(0)
		}
		l.lost[i].Store(0)
		l.first[i].Store(nil)
	}
}

// Counts returns the requests sent and failed since the last reset.
func (l *Load) Counts() (attempted, failed int64) {
	for i := range l.tallies {
		for j := range l.tallies[i] {
			attempted += l.tallies[i][j].attempted.Load()
			failed += l.tallies[i][j].failed.Load()
		}
	}
	return attempted, failed
}

// FailedThroughSurvivors returns, since the last reset, how many GETs
// (post false) or POSTs failed whose entry relay stayed up while they were
// in flight, and the first such failure.
func (l *Load) FailedThroughSurvivors(post bool) (int64, string) {
	i := b2i(post)
	n := l.tallies[i][0].failed.Load() + l.tallies[i][1].failed.Load() - l.lost[i].Load()
	first := ""
	if p := l.first[i].Load(); p != nil {
		first = *p
	}
	return n, first
}

// Summary says, per kind, how many requests were sent and failed since the
// last reset: "GET 1200 (800 forwarded), 0 failed (0 forwarded); POST …".
func (l *Load) Summary() string {
	var parts []string
	for i, name := range []string{"GET", "POST"} {
		loc, fwd := &l.tallies[i][0], &l.tallies[i][1]
		parts = append(parts, fmt.Sprintf("%s %d (%d forwarded), %d failed (%d forwarded)", name,
			loc.attempted.Load()+fwd.attempted.Load(), fwd.attempted.Load(), loc.failed.Load()+fwd.failed.Load(), fwd.failed.Load()))
	}
	return strings.Join(parts, "; ")
}

// Stop ends the load and waits for its requests.
func (l *Load) Stop() { l.cancel(); <-l.done }
