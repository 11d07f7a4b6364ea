package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// measureLatency times cfg.N sequential GETs of /small after cfg.Warmup
// untimed ones, and splits each at the moment the backend handled it: the
// way there (client → backend) and the way back (backend → client). The
// backend is another process on this machine: both ends read the same
// kernel wall clock.
func measureLatency(ctx context.Context, e env, r *results) error {
	url := e.t.base + "/small"
	var there, back []time.Duration
	op := func(ctx context.Context) error {
		start := time.Now()
		handled, err := getHandled(ctx, e.c, url)
		if err != nil {
			return err
		}
		there = append(there, handled.Sub(start))
		back = append(back, time.Since(handled))
		return nil
	}
	samples, err := timeSeries(ctx, e.cfg.MaxSeries, e.cfg.Warmup, e.cfg.N, op)
	if err != nil {
		return err
	}
	raw := &r.raw
	raw.latency, raw.latencyWant = append(raw.latency, samples...), raw.latencyWant+e.cfg.N
	raw.there = append(raw.there, there[len(there)-len(samples):]...) // the timed ones, after the warm-up
	raw.back = append(raw.back, back[len(back)-len(samples):]...)
	r.Latency = summarize(raw.latency, raw.latencyWant)
	r.ThereP50 = summarize(raw.there, len(raw.there)).P50
	r.BackP50 = summarize(raw.back, len(raw.back)).P50
	if e.t.relayURL == "" {
		return nil
	}
	healthz := func(ctx context.Context) error { return get(ctx, e.c, e.t.relayURL+"/healthz") }
	h, err := timeSeries(ctx, e.cfg.MaxSeries, e.cfg.Warmup, e.cfg.N, healthz)
	raw.healthz, raw.healthzWant = append(raw.healthz, h...), raw.healthzWant+e.cfg.N
	r.HealthzP50 = summarize(raw.healthz, raw.healthzWant).P50
	return err
}

// getHandled is get for /small, returning when the backend handled the request.
func getHandled(ctx context.Context, c *http.Client, url string) (time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return time.Time{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return time.Time{}, err
	}
	defer resp.Body.Close()
	if err := checkStatus(resp); err != nil {
		return time.Time{}, err
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return time.Time{}, err
	}
	ns, err := strconv.ParseInt(resp.Header.Get(handledHeader), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("no %s header in the answer: %w", handledHeader, err)
	}
	return time.Unix(0, ns), nil
}

// measureRPS runs cfg.Concurrency GET loops on /small for cfg.Duration,
// after a short untimed run that opens the connections. It also takes the
// CPU time the backend spent per request and, through a relay, the relay's
// and the agent's.
func measureRPS(ctx context.Context, e env, r *results) error {
	url := e.t.base + "/small"
	warm := min(time.Second, e.cfg.Duration/5)
	if _, _, err := loadLoop(ctx, e.c, url, e.cfg.Concurrency, warm); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	before, err := e.t.cpuTimes()
	if err != nil {
		return err
	}
	n, elapsed, err := loadLoop(ctx, e.c, url, e.cfg.Concurrency, e.cfg.Duration)
	if err != nil {
		return err
	}
	after, err := e.t.cpuTimes()
	if err != nil {
		return err
	}
	raw := &r.raw
	raw.requests += n
	raw.elapsed += elapsed
	raw.cpu.backend += after.backend - before.backend
	raw.cpu.relay += after.relay - before.relay
	raw.cpu.agent += after.agent - before.agent
	r.RPS = float64(raw.requests) / raw.elapsed.Seconds()
	if raw.requests > 0 {
		r.BackendCPUPerReq = raw.cpu.backend / time.Duration(raw.requests)
	}
	if e.t.relay != nil && raw.requests > 0 {
		r.RelayCPUPerReq = raw.cpu.relay / time.Duration(raw.requests)
		r.AgentCPUPerReq = raw.cpu.agent / time.Duration(raw.requests)
	}
	return nil
}

// cpuTimes are the CPU times used so far by the processes of a target.
type cpuTimes struct{ relay, agent, backend time.Duration }

// cpuTimes returns the CPU time used so far by the backend and, through a
// relay, by the relay and the agent (zeros when direct).
func (t target) cpuTimes() (cpuTimes, error) {
	var out cpuTimes
	var err1, err2, err3 error
	out.backend, err1 = t.backend.cpuTime()
	var err4 error
	if t.relay != nil {
		out.relay, err2 = t.relay.cpuTime()
		out.agent, err3 = t.agent.cpuTime()
	}
	if t.holder != nil {
		var held time.Duration
		held, err4 = t.holder.cpuTime()
		out.relay += held
	}
	return out, errors.Join(err1, err2, err3, err4)
}

// loadLoop runs conc GET loops on url until d has passed and returns the
// requests completed, the time until the last one ended, and the first error.
func loadLoop(ctx context.Context, c *http.Client, url string, conc int, d time.Duration) (int64, time.Duration, error) {
	var done atomic.Int64
	var firstErr error
	var once sync.Once // guards firstErr
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	rctx, cancel := context.WithTimeout(ctx, d+30*time.Second) // bounds a stuck request
	defer cancel()
	for range conc {
		wg.Go(func() {
			for time.Now().Before(end) {
				if err := get(rctx, c, url); err != nil {
					once.Do(func() { firstErr = err })
					cancel() // the others stop too
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	return done.Load(), time.Since(start), firstErr
}
