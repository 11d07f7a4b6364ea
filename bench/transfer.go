package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// counter is an io.Writer that counts and drops what it gets. It has no
// ReadFrom, so io.CopyBuffer uses the buffer it is given.
type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// measureDownload fetches cfg.DownloadMB from /bytes.
func measureDownload(ctx context.Context, e env, r *results) error {
	n := int64(e.cfg.DownloadMB) * 1e6
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.t.base+"/bytes?n="+strconv.FormatInt(n, 10), nil)
	if err != nil {
		return err
	}
	resp, err := e.c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := checkStatus(resp); err != nil {
		return err
	}
	var cnt counter
	if _, err := io.CopyBuffer(&cnt, resp.Body, make([]byte, 256<<10)); err != nil {
		return fmt.Errorf("read after %d bytes: %w", cnt.n, err)
	}
	if cnt.n != n {
		return fmt.Errorf("got %d bytes, want %d", cnt.n, n)
	}
	r.DownloadMBps = mbps(n, time.Since(start))
	return nil
}

// measureUpload posts cfg.UploadMB to /upload and, through a relay, samples
// the relay's and the agent's RSS before and during the upload.
func measureUpload(ctx context.Context, e env, r *results) error {
	n := int64(e.cfg.UploadMB) * 1e6
	if e.t.relay == nil {
		var err error
		r.UploadMBps, err = upload(ctx, e.c, e.t.base+"/upload", n)
		return err
	}
	relay, agent := startRSSSampler(e.t.relay), startRSSSampler(e.t.agent)
	var err error
	r.UploadMBps, err = upload(ctx, e.c, e.t.base+"/upload", n)
	relay.stop()
	agent.stop()
	r.RelayRSS, r.AgentRSS = relay.result, agent.result
	return errors.Join(err, relay.err, agent.err)
}

// upload posts n bytes to url and returns MB/s; the backend answers
// with the byte count it read.
func upload(ctx context.Context, c *http.Client, url string, n int64) (float64, error) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, newPattern(n))
	if err != nil {
		return 0, err
	}
	req.ContentLength = n
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if err := checkStatus(resp); err != nil {
		return 0, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64))
	if err != nil {
		return 0, fmt.Errorf("read answer: %w", err)
	}
	if got := strings.TrimSpace(string(body)); got != strconv.FormatInt(n, 10) {
		return 0, fmt.Errorf("backend read %s bytes, want %d", got, n)
	}
	return mbps(n, time.Since(start)), nil
}

func mbps(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

// rssSampler polls a process's RSS every few milliseconds and keeps the first
// value and the peak.
type rssSampler struct {
	p      *proc
	done   chan struct{}
	wg     sync.WaitGroup
	result rss   // valid after stop
	err    error // valid after stop
}

func startRSSSampler(p *proc) *rssSampler {
	s := &rssSampler{p: p, done: make(chan struct{})}
	s.result.Before, s.err = p.rssBytes()
	s.result.Peak = s.result.Before
	s.wg.Go(s.loop)
	return s
}

func (s *rssSampler) loop() {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tick.C:
			if v, err := s.p.rssBytes(); err == nil {
				s.result.Peak = max(s.result.Peak, v)
			}
		}
	}
}

// stop ends the sampling and takes a last sample.
func (s *rssSampler) stop() {
	close(s.done)
	s.wg.Wait()
	if v, err := s.p.rssBytes(); err == nil {
		s.result.Peak = max(s.result.Peak, v)
	}
}
