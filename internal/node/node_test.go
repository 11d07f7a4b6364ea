package node_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/fleettest"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// These tests run a real node (embedded NATS, both listeners on loopback
// port 0), a real backend and a real agent in the test process, and stop the
// node with Shutdown (drain) or Close.

const device = "dev"

// stepBackend streams a response whose lines the test releases one by one,
// so that the test decides when it ends; /forever never ends by itself.
type stepBackend struct {
	*httptest.Server
	step chan struct{} // one receive per line of /steps
}

const stepLines = 4

func newStepBackend(t *testing.T) *stepBackend {
	t.Helper()
	b := &stepBackend{step: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/steps", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		for i := range stepLines {
			select {
			case <-b.step:
			case <-r.Context().Done():
				return
			}
			fmt.Fprintf(w, "line %d\n", i)
			http.NewResponseController(w).Flush()
		}
	})
	mux.HandleFunc("/forever", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "first line")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	b.Server = httptest.NewServer(mux)
	t.Cleanup(b.Close)
	return b
}

// startNode starts a node on loopback ports with anonymous agents and users.
func startNode(t *testing.T, opts ...func(*node.Config)) *node.Node {
	t.Helper()
	cfg := node.Config{
		Listen:               "127.0.0.1:0",
		AdminListen:          "127.0.0.1:0",
		DataDir:              t.TempDir(),
		AllowAnonymousAgents: true,
		AllowAnonymousUsers:  true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	n, err := node.Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("node.Start: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// startAgent runs an agent for device in front of backend speaking proto,
// and waits until the node sees it. It stops when the test ends.
func startAgent(t *testing.T, n *node.Node, backend, proto string) {
	t.Helper()
	a, err := agent.New(agent.Config{
		Relays:       []*url.URL{{Scheme: "http", Host: n.Addr()}},
		Device:       device,
		Backend:      &url.URL{Scheme: "http", Host: strings.TrimPrefix(backend, "http://")},
		Protocol:     proto,
		PreserveHost: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	fleettest.Eventually(t, 10*time.Second, func() error {
		if slices.Contains(n.Devices(), device) {
			return nil
		}
		return errors.New("the agent has not connected yet")
	})
}

// openStream GETs path of the device through the relay and reads the header.
func openStream(t *testing.T, n *node.Node, path string) (*http.Response, *bufio.Reader) {
	t.Helper()
	resp, err := fleettest.NewClient(t, true).Get("http://" + n.Addr() + "/client/" + device + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s %s", path, resp.Status, b)
	}
	return resp, bufio.NewReader(resp.Body)
}

var protocols = []string{agent.ProtocolLongPoll, agent.ProtocolNative}

// TestShutdownDrainsInFlightStream: during a drain the relay says it is not
// ready, takes no new work, and lets a stream in flight run to its end; then
// Shutdown returns nil.
//
// The admin listener stays up until the end and answers /readyz 503. What the
// public listener does is asserted loosely, as either of two designs passes:
// today Shutdown closes it at the start (http.Server.Shutdown), so /readyz and
// a new long poll there are refused. But long-poll agents post each chunk of
// a response as a new request to that listener, so closing it first cuts
// their streams (the longpoll case fails); kept open until nothing is in
// flight, /readyz there answers 503 and a new poll is held, then gets 408.
// Never 200 either way.
func TestShutdownDrainsInFlightStream(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			n := startNode(t)
			b := newStepBackend(t)
			startAgent(t, n, b.URL, proto)
			probes := fleettest.NewClient(t, false)
			if code, err := fleettest.Status(probes, "http://"+n.AdminAddr()+"/readyz"); code != http.StatusOK {
				t.Fatalf("admin /readyz before the drain: %d %v", code, err)
			}
			if code, err := fleettest.Status(probes, "http://"+n.Addr()+"/readyz"); code != http.StatusOK {
				t.Fatalf("public /readyz before the drain: %d %v", code, err)
			}

			_, rd := openStream(t, n, "/steps")
			b.step <- struct{}{}
			if line, err := rd.ReadString('\n'); line != "line 0\n" {
				t.Fatalf("first line %q, %v", line, err)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			shutdown := make(chan error, 1)
			start := time.Now()
			go func() {
				defer func() {
					if p := recover(); p != nil {
						shutdown <- fmt.Errorf("Shutdown panicked: %v", p)
					}
				}()
				shutdown <- n.Shutdown(ctx)
			}()

			// Not ready any more, while the stream is still running (the
			// backend sends its next line only when told).
			fleettest.Eventually(t, 5*time.Second, func() error {
				code, err := fleettest.Status(probes, "http://"+n.AdminAddr()+"/readyz")
				if code != http.StatusServiceUnavailable {
					return fmt.Errorf("admin /readyz answered %d, %v; want 503", code, err)
				}
				return nil
			})
			fleettest.Eventually(t, 5*time.Second, func() error {
				code, err := fleettest.Status(probes, "http://"+n.Addr()+"/readyz")
				if code == http.StatusServiceUnavailable || refused(err) {
					return nil
				}
				return fmt.Errorf("public /readyz answered %d, %v; want 503 or a refused connection", code, err)
			})
			// A new poll gets no request: 408 (perhaps only once the drain is
			// over) or a refused connection.
			type pollResult struct {
				code int
				err  error
			}
			newPoll := make(chan pollResult, 1)
			go func() {
				code, err := fleettest.Status(probes, "http://"+n.Addr()+"/server/request?server="+device)
				newPoll <- pollResult{code, err}
			}()
			select {
			case err := <-shutdown:
				t.Fatalf("Shutdown returned %v while a stream was in flight", err)
			default:
			}

			// The stream runs to its end.
			for i := 1; i < stepLines; i++ {
				b.step <- struct{}{}
				line, err := rd.ReadString('\n')
				if want := fmt.Sprintf("line %d\n", i); line != want {
					t.Fatalf("line %d during the drain: %q, %v; want %q", i, line, err, want)
				}
			}
			if rest, err := io.ReadAll(rd); err != nil || len(rest) != 0 {
				t.Fatalf("end of the stream: %q, %v; want a clean end", rest, err)
			}

			select {
			case err := <-shutdown:
				if err != nil {
					t.Fatalf("Shutdown: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("Shutdown did not return after the last stream ended")
			}
			if p := <-newPoll; p.code != http.StatusRequestTimeout && !refused(p.err) {
				t.Fatalf("a new poll during the drain got %d, %v; want 408 or a refused connection", p.code, p.err)
			} else {
				t.Logf("a new poll during the drain got status %d, err %v", p.code, p.err)
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("the drain took %v", took)
			}
			if _, err := fleettest.Status(probes, "http://"+n.AdminAddr()+"/readyz"); !refused(err) {
				t.Fatalf("admin listener after Shutdown: %v, want closed", err)
			}
			if err := n.Close(); err != nil {
				t.Fatalf("Close after Shutdown: %v", err)
			}
		})
	}
}

// TestShutdownCutsAtTheDeadline: a stream that never ends is cut when the
// drain's context ends, and Shutdown says the drain did not finish.
func TestShutdownCutsAtTheDeadline(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			n := startNode(t)
			b := newStepBackend(t)
			startAgent(t, n, b.URL, proto)
			_, rd := openStream(t, n, "/forever")
			if line, err := rd.ReadString('\n'); line != "first line\n" {
				t.Fatalf("first line %q, %v", line, err)
			}
			read := make(chan error, 1)
			go func() {
				_, err := io.Copy(io.Discard, rd)
				read <- err
			}()

			const deadline = time.Second
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err := n.Shutdown(ctx)
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), "drain") || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Shutdown = %v, want an error about the drain wrapping context.DeadlineExceeded", err)
			}
			if took < deadline || took > deadline+5*time.Second {
				t.Fatalf("Shutdown returned after %v, want just after the %v deadline", took, deadline)
			}
			select {
			case err := <-read:
				if err == nil {
					t.Fatal("the cut stream ended cleanly; want an error so that the user knows it was cut")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the stream was not cut")
			}
		})
	}
}

// TestCloseIsFastAndIdempotent: Close cuts a stream in flight at once, and a
// second Close (or one racing it) is harmless.
func TestCloseIsFastAndIdempotent(t *testing.T) {
	n := startNode(t)
	b := newStepBackend(t)
	startAgent(t, n, b.URL, agent.ProtocolLongPoll)
	_, rd := openStream(t, n, "/forever")
	if line, err := rd.ReadString('\n'); line != "first line\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	start := time.Now()
	done := make(chan error, 2)
	go func() { done <- n.Close() }()
	go func() { done <- n.Close() }()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close hangs")
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close took %v with a stream in flight, want at once", took)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("third Close: %v", err)
	}
	if _, err := io.Copy(io.Discard, rd); err == nil {
		t.Fatal("the stream cut by Close ended cleanly")
	}
	if _, err := fleettest.Status(fleettest.NewClient(t, false), "http://"+n.Addr()+"/healthz"); !refused(err) {
		t.Fatalf("public listener after Close: %v, want closed", err)
	}
}

// TestStartFailsCleanly: a listener that cannot open fails Start with a
// message naming it, and leaves nothing running (goleak checks).
func TestStartFailsCleanly(t *testing.T) {
	n := startNode(t)
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Start panicked on a failure instead of returning an error: %v", p)
		}
	}()
	_, err := node.Start(t.Context(), node.Config{
		Listen:      n.Addr(), // taken
		AdminListen: "127.0.0.1:0",
		DataDir:     t.TempDir(),
	})
	if err == nil || !strings.Contains(err.Error(), "public listener") {
		t.Fatalf("Start on a taken port: %v, want a public listener error", err)
	}
}

// refused reports whether err means that the listener is closed: the
// connection was refused, or it was reset (or closed before any answer)
// because it was still in the accept queue when the listener closed.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}
