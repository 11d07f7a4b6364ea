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

	"golang.org/x/net/http2"

	"github.com/switchboard-relay/switchboard/internal/replay"
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

// TestLostRequestComesBackToItsRouter: a GET whose agent died with it in
// flight comes back with an error that package replay reads as lost, not
// sent to the other agent behind the router's back; sent again, as the
// router does once, it reaches the other agent.
func TestLostRequestComesBackToItsRouter(t *testing.T) {
	p, died := flakyAgents(t)
	req, _ := http.NewRequest(http.MethodGet, "http://dev/flaky", nil)
	_, err := p.RoundTrip(req)
	if f := replay.Classify(err); f != replay.Lost || !died.Load() {
		t.Fatalf("GET whose agent died: %v (%v), an agent died: %v; want a lost request", err, f, died.Load())
	}
	if !replay.Repeatable(req) {
		t.Fatal("a GET without a body may not be repeated")
	}
	resp, err := p.RoundTrip(req)
	if err != nil {
		t.Fatalf("the GET sent again: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("answer %q", b)
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

// TestUnsent checks which failures mean that a request never left, so
// that it moves to another session, and that one that may have left never
// does.
func TestUnsent(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"GOAWAY before the request", errors.New("http2: client conn not usable"), true},
		{"a tunnel that died as it opened", errors.New("http2: client conn could not be established"), true},
		{"no session left", http2.ErrNoCachedConn, true},
		{"the connection lost with the request in flight", errors.New("http2: client connection lost"), false},
		{"a reset", syscall.ECONNRESET, false},
	} {
		if got := unsent(c.err, httptest.NewRequest(http.MethodPost, "http://dev/", nil)); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
