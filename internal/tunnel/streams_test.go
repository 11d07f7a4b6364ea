package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// blockingAgent serves a tunnel whose handler for /block holds each request
// until release is closed; other paths answer at once.
type blockingAgent struct {
	pool    *Pool
	entered chan struct{}
	release chan struct{}
	once    sync.Once // closes release
}

func startBlockingAgent(t *testing.T, maxStreams int) *blockingAgent {
	t.Helper()
	a := &blockingAgent{entered: make(chan struct{}, 1024), release: make(chan struct{})}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			a.entered <- struct{}{}
			select {
			case <-a.release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "done")
	})
	ctx, cancel := context.WithCancel(context.Background())
	relayEnd, agentEnd := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		Serve(ctx, agentEnd, h, Liveness{})
	}()
	a.pool = NewPool(Liveness{}, nil)
	a.pool.MaxStreams = maxStreams
	if _, err := a.pool.Add(relayEnd, "dev", "", ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.releaseAll()
		cancel()
		<-served
		a.pool.Close()
	})
	if got := get(t, a.pool); got != "done" { // the agent's SETTINGS have arrived
		t.Fatalf("got %q", got)
	}
	return a
}

func (a *blockingAgent) releaseAll() { a.once.Do(func() { close(a.release) }) }

// hold starts n requests to /block and waits until the agent holds them
// all; wait returns their errors once released.
func (a *blockingAgent) hold(t *testing.T, n int) (wait func() []error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, "http://dev/block", nil)
			resp, err := a.pool.RoundTrip(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			errs[i] = err
		})
	}
	timeout := time.After(10 * time.Second)
	for i := range n {
		select {
		case <-a.entered:
		case <-timeout:
			a.releaseAll()
			wg.Wait()
			t.Fatalf("the agent holds %d requests of %d: %v", i, n, errors.Join(errs...))
		}
	}
	return func() []error { wg.Wait(); return errs }
}

func busyRoundTrip(t *testing.T, p *Pool) *BusyError {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://dev/more", nil)
	resp, err := p.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a request past the cap got %s, want a BusyError", resp.Status)
	}
	var be *BusyError
	if !errors.As(err, &be) || !errors.Is(err, ErrBusy) {
		t.Fatalf("a request past the cap failed with %v, want a BusyError", err)
	}
	return be
}

func TestStreamCapPerAgent(t *testing.T) {
	a := startBlockingAgent(t, 2)
	wait := a.hold(t, 2)

	be := busyRoundTrip(t, a.pool)
	if be.HTTPStatus() != http.StatusServiceUnavailable || be.RetryAfterDelay() < time.Second {
		t.Errorf("status %d, retry after %v; want 503 and at least 1s", be.HTTPStatus(), be.RetryAfterDelay())
	}
	want := `device "dev" is busy: its agent has 2 requests in flight, the most it takes at once; try again shortly`
	if be.Error() != want {
		t.Errorf("message %q, want %q", be, want)
	}
	if !a.pool.Ready("dev") {
		t.Error("a busy device is not Ready: the router would look for its agent elsewhere")
	}
	if got := a.pool.busy.Load(); got != 1 {
		t.Errorf("busy refusals counted %d, want 1", got)
	}

	a.releaseAll()
	for _, err := range wait() {
		if err != nil {
			t.Errorf("a held request failed: %v", err)
		}
	}
	if got := get(t, a.pool); got != "done" {
		t.Fatalf("after the held requests ended: got %q", got)
	}
	if n := a.pool.inflightTotal(); n != 0 {
		t.Errorf("%d requests in flight after all ended", n)
	}
}

func TestStreamCapFollowsTheAgentsAdvertisement(t *testing.T) {
	a := startBlockingAgent(t, 4*DefaultMaxStreams) // the agent advertises DefaultMaxStreams
	wait := a.hold(t, DefaultMaxStreams)
	be := busyRoundTrip(t, a.pool)
	if be.Cap != DefaultMaxStreams || !strings.Contains(be.Error(), "256 requests in flight") {
		t.Errorf("cap %d, message %q; want the agent's %d", be.Cap, be, DefaultMaxStreams)
	}
	a.releaseAll()
	for _, err := range wait() {
		if err != nil {
			t.Fatalf("a held request failed: %v", err)
		}
	}
}

func TestBusyErrorNamesEveryAgent(t *testing.T) {
	be := &BusyError{Device: "robot-7", Agents: 3, Cap: 256}
	want := `device "robot-7" is busy: its 3 agents have 256 requests in flight each, the most they take at once; try again shortly`
	if be.Error() != want {
		t.Errorf("message %q, want %q", be, want)
	}
}
