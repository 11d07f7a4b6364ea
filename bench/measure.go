package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"time"
)

// target is what the clients talk to: the backend itself, or the device
// through a relay.
type target struct {
	name  string // "direct" or the protocol
	base  string // base URL; /small, /bytes, /upload and /ws are under it
	relay *proc  // the relay process, nil when direct
	// holder, with -forwarded, is the relay holding the device, to which
	// relay forwards every request; its CPU counts as the relay's.
	holder *proc
	// relayURL is the relay's own base URL ("" when direct), for its
	// /healthz: one HTTP exchange with the relay process and no agent.
	relayURL string
	agent    *proc // the agent process, nil when direct
	// backend is the backend process, the same for direct and every relay.
	backend *proc
}

// results are one target's measurements.
type results struct {
	Latency series // sequential small GETs
	// ThereP50 and BackP50 split the small GETs' latency at the backend:
	// the median time from the client to the backend, and back.
	ThereP50, BackP50 time.Duration
	// HealthzP50 is the median latency of the relay's own /healthz, the
	// floor of one HTTP exchange with another process; zero when direct.
	HealthzP50   time.Duration
	RPS          float64
	DownloadMBps float64
	UploadMBps   float64
	WS           series // websocket echo round trips
	RelayRSS     rss    // zero when direct
	AgentRSS     rss    // zero when direct
	// RelayCPUPerReq and AgentCPUPerReq are the processes' CPU time (user
	// and system) per request during the request-rate test; zero when direct.
	RelayCPUPerReq, AgentCPUPerReq time.Duration
	// BackendCPUPerReq is the backend process's CPU time per request during
	// the request-rate test, direct or through a relay.
	BackendCPUPerReq time.Duration
	// Failed names the measurements that failed.
	Failed map[string]bool
	// ProtocolsSeen are the protocols the agent's log says it connected
	// with; nil when direct.
	ProtocolsSeen []string

	// What the measurements gathered, over all the rounds they ran in
	// (see config.Rounds): the summaries above are made from them.
	raw rawResults
}

// rawResults are the samples and counts the summaries of results come
// from, kept so that a measurement run again (in the next round) adds to
// them.
type rawResults struct {
	latency, there, back, healthz, ws []time.Duration
	latencyWant, healthzWant, wsWant  int
	requests                          int64
	elapsed                           time.Duration
	cpu                               cpuTimes // the request-rate tests' CPU time, summed
}

// series summarizes timed samples.
type series struct {
	P50, P99 time.Duration
	N, Want  int // samples taken and asked for
}

// rss is a process's resident set size before and at the peak of the upload.
type rss struct{ Before, Peak int64 }

// env is what every measurement needs.
type env struct {
	cfg *config
	c   *http.Client // keeps up to cfg.Concurrency connections
	t   target
}

// step is one measurement: it fills its part of r.
type step struct {
	name string
	run  func(ctx context.Context, e env, r *results) error
}

// steps lists the measurements in the order they run.
var steps = []step{
	{testLatency, measureLatency},
	{testRPS, measureRPS},
	{testDownload, measureDownload},
	{testUpload, measureUpload},
	{testWS, measureWS},
}

// testNames returns the names of the measurements, in the order they run.
func testNames() []string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.name
	}
	return names
}

// newClient returns an HTTP/1.1 client keeping up to conns connections.
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		DisableCompression:  true,
		WriteBufferSize:     64 << 10,
		ReadBufferSize:      64 << 10,
	}}
}

// get fetches url, expecting 200, and discards the body.
func get(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := checkStatus(resp); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// timeSeries runs op warmup times, then times it want times, and returns
// the timed samples; each part ends early, with the samples it has, when
// limit passes.
func timeSeries(ctx context.Context, limit time.Duration, warmup, want int, op func(context.Context) error) ([]time.Duration, error) {
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for range warmup {
		if err := op(wctx); err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				break // warm enough
			}
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	tctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	samples := make([]time.Duration, 0, want)
	for len(samples) < want {
		start := time.Now()
		if err := op(tctx); err != nil {
			if tctx.Err() != nil && ctx.Err() == nil && len(samples) > 0 {
				break // cut short by the limit
			}
			return nil, err
		}
		samples = append(samples, time.Since(start))
	}
	return samples, nil
}

// summarize returns the percentiles of samples, which it leaves as they
// are.
func summarize(samples []time.Duration, want int) series {
	sorted := slices.Sorted(slices.Values(samples))
	return series{P50: percentile(sorted, 50), P99: percentile(sorted, 99), N: len(sorted), Want: want}
}

// percentile returns the p-th percentile (nearest rank) of sorted samples.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 * n)
	return sorted[max(rank, 1)-1]
}
