package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// flakyAgents starts a pool with two agents for "dev". The first request
// either agent receives kills that agent's connection before any answer;
// every later request is answered "ok". died reports whether one died.
func flakyAgents(t *testing.T) (p *Pool, died *atomic.Bool) {
	t.Helper()
	p = NewPool(Liveness{}, nil)
	died = new(atomic.Bool)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	t.Cleanup(func() {
		cancel()
		<-done
		<-done
		p.Close()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for range 2 {
		// Real sockets: a dying agent shows as it does in production.
		relayEnd, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		agentEnd, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if r.URL.Path == "/flaky" && died.CompareAndSwap(false, true) {
				agentEnd.Close() // the agent dies with the request in flight
				<-r.Context().Done()
				return
			}
			io.WriteString(w, "ok")
		})
		go func() {
			defer func() { done <- struct{}{} }()
			Serve(ctx, agentEnd, h, Liveness{})
		}()
		if _, err := p.Add(relayEnd, "dev", "", ""); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // both agents' SETTINGS have arrived
		if got := get(t, p); got != "ok" {
			t.Fatalf("got %q", got)
		}
	}
	return p, died
}

func TestLostIdempotentRequestMovesToAnotherAgent(t *testing.T) {
	p, died := flakyAgents(t)
	req, _ := http.NewRequest(http.MethodGet, "http://dev/flaky", nil)
	resp, err := p.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET whose agent died: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" || !died.Load() {
		t.Fatalf("answer %q, an agent died: %v", b, died.Load())
	}
}

func TestLostRequestsThatMayNotBeRepeatedFail(t *testing.T) {
	for _, c := range []struct {
		name string
		req  func() *http.Request
	}{
		{"POST", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "http://dev/flaky", io.NopCloser(strings.NewReader("x")))
			return r
		}},
		{"POST whose body could be sent again", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "http://dev/flaky", strings.NewReader("x"))
			return r
		}},
		{"PATCH", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPatch, "http://dev/flaky", strings.NewReader("x"))
			return r
		}},
		{"GET with a body that cannot be read again", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "http://dev/flaky", io.NopCloser(strings.NewReader("x")))
			return r
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, died := flakyAgents(t)
			resp, err := p.RoundTrip(c.req())
			if err == nil {
				resp.Body.Close()
				t.Fatalf("answered %s; want the error of the lost connection", resp.Status)
			}
			if !died.Load() {
				t.Fatal("no agent died: the test tested nothing")
			}
		})
	}
}

// TestLostIdempotent checks which requests a relay sends again after the
// tunnel they were on was given up (the relay's pings went unanswered:
// x/net reports "http2: client connection lost").
func TestLostIdempotent(t *testing.T) {
	lost := errors.New(errClientConnLost)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		req  func() *http.Request
		err  error
		want bool
	}{
		{"GET", func() *http.Request { return httptest.NewRequest(http.MethodGet, "http://dev/", nil) }, lost, true},
		{"HEAD, connection reset", func() *http.Request { return httptest.NewRequest(http.MethodHead, "http://dev/", nil) }, syscall.ECONNRESET, true},
		{"GET with a body that can be had again", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "http://dev/", strings.NewReader("q"))
			return r
		}, lost, true},
		{"GET, another error", func() *http.Request { return httptest.NewRequest(http.MethodGet, "http://dev/", nil) }, errors.New("http2: stream reset"), false},
		{"POST", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "http://dev/", strings.NewReader("q"))
			return r
		}, lost, false},
		{"DELETE", func() *http.Request { return httptest.NewRequest(http.MethodDelete, "http://dev/", nil) }, lost, false},
		{"websocket", func() *http.Request {
			r := httptest.NewRequest(http.MethodGet, "http://dev/ws", nil)
			r.Header.Set("Upgrade", "websocket")
			return r
		}, lost, false},
		{"the user went away", func() *http.Request {
			return httptest.NewRequest(http.MethodGet, "http://dev/", nil).WithContext(canceled)
		}, lost, false},
	} {
		if got := lostIdempotent(c.err, c.req()); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestUnsent checks which failures mean that a request without a body
// never left, so that it moves to another session as it is.
func TestUnsent(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"GOAWAY before the request", errors.New(errClientConnUnusable), true},
		{"a tunnel that died as it opened", errors.New(errClientConnNotEstablished), true},
		{"the connection lost with the request in flight", errors.New(errClientConnLost), false},
		{"a reset", syscall.ECONNRESET, false},
	} {
		if got := unsent(c.err, httptest.NewRequest(http.MethodPost, "http://dev/", nil)); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
