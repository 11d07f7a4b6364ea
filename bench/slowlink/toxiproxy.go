package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
)

// toxiproxy is a running toxiproxy-server and its HTTP API.
type toxiproxy struct {
	proc *procfleet.Proc
	api  string
}

// startToxiproxy starts bin with its API on a free loopback port and waits
// until the API answers.
func startToxiproxy(ctx context.Context, bin, dir string) (*toxiproxy, error) {
	port := benchkit.FreePort()
	out, err := os.Create(filepath.Join(dir, "toxiproxy.log"))
	if err != nil {
		return nil, err
	}
	p, err := procfleet.StartProc("toxiproxy", bin, []string{"-host", "127.0.0.1", "-port", port}, out)
	if err != nil {
		return nil, err
	}
	t := &toxiproxy{proc: p, api: "http://127.0.0.1:" + port}
	err = benchkit.Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
		if err := p.Err(); err != nil {
			return err
		}
		return t.call(ctx, http.MethodGet, "/version", nil)
	})
	if err != nil {
		p.Kill()
		return nil, fmt.Errorf("toxiproxy's API at %s: %w", t.api, err)
	}
	return t, nil
}

// proxy creates a proxy named name in front of upstream, with the link's
// latency and bandwidth on both directions, and returns where it listens.
func (t *toxiproxy) proxy(ctx context.Context, name, upstream string, o options) (string, error) {
	listen := "127.0.0.1:" + benchkit.FreePort()
	err := t.call(ctx, http.MethodPost, "/proxies", map[string]any{"name": name, "listen": listen, "upstream": upstream, "enabled": true})
	if err != nil {
		return "", err
	}
	for _, stream := range []string{"upstream", "downstream"} {
		toxics := []map[string]any{
			{"name": name + "-latency-" + stream, "type": "latency", "stream": stream, "toxicity": 1.0,
				"attributes": map[string]any{"latency": o.latency.Milliseconds(), "jitter": 0}},
			{"name": name + "-bandwidth-" + stream, "type": "bandwidth", "stream": stream, "toxicity": 1.0,
				"attributes": map[string]any{"rate": o.rateKBps}},
		}
		for _, tx := range toxics {
			if err := t.call(ctx, http.MethodPost, "/proxies/"+name+"/toxics", tx); err != nil {
				return "", err
			}
		}
	}
	return listen, nil
}

// call sends body as JSON to the API and fails on any answer but 2xx.
func (t *toxiproxy) call(ctx context.Context, method, path string, body any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, t.api+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("toxiproxy %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
