package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// PathStop stops the relay that answers, as SIGTERM would: it drains (its
// readiness turns false, its agents move, requests in flight finish) and
// exits. It is what a Kubernetes preStop hook calls.
const PathStop = "/api/v1/relay/stop"

// StopAnswer answers POST /api/v1/relay/stop.
type StopAnswer struct {
	// Stopping is true: the relay has begun to drain.
	Stopping bool `json:"stopping"`
}

func (h *handler) stop(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Stop == nil {
		writeError(w, http.StatusServiceUnavailable, "this relay cannot be stopped through its operator API; send it SIGTERM")
		return
	}
	h.log.Info("stop asked for through the operator API", logkey.Remote, r.RemoteAddr)
	h.cfg.Stop()
	writeJSON(w, http.StatusAccepted, StopAnswer{Stopping: true})
}

// Stop asks the relay at BaseURL to drain and stop, then waits, at most
// wait, until its admin listener no longer answers: the relay closes it
// last, once its drain is over. It returns nil then, or an error saying the
// relay is still draining when wait ran out.
func (c *Client) Stop(ctx context.Context, wait time.Duration) error {
	var ans StopAnswer
	if err := c.do(ctx, http.MethodPost, PathStop, nil, http.StatusAccepted, &ans); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for c.answers(ctx) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the relay at %s is still draining after %s", c.BaseURL, wait)
		case <-tick.C:
		}
	}
	return nil
}

// answers reports whether the admin listener still answers /healthz.
func (c *Client) answers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.BaseURL, "/")+PathHealthz, nil)
	if err != nil {
		return false
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return errors.Is(err, context.DeadlineExceeded) // slow is not gone
	}
	resp.Body.Close()
	return true
}
