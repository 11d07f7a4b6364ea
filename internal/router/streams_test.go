package router

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/forward"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// fakeStreams is the stream forward to each holder: a holder named in
// unavailable serves no stream (its agent is version 1, or it predates
// streams), one in lost loses the request on the way, the others answer
// "stream <host>". Every call is noted.
type fakeStreams struct {
	mu          sync.Mutex // guards calls
	unavailable map[string]bool
	lost        map[string]error
	calls       []string
}

func (s *fakeStreams) RoundTrip(req *http.Request, holderID, _ string) (*http.Response, error) {
	s.mu.Lock()
	s.calls = append(s.calls, holderID)
	s.mu.Unlock()
	if s.unavailable[holderID] {
		return nil, fmt.Errorf("%w: version 1", forward.ErrUnavailable)
	}
	if err := s.lost[holderID]; err != nil {
		if req.Body != nil {
			io.Copy(io.Discard, req.Body) // it went out
		}
		return nil, err
	}
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("stream " + holderID)), Request: req}, nil
}

func body(t *testing.T, resp *http.Response, err error) string {
	t.Helper()
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// read returns body for t as a function of a round trip's results.
func read(t *testing.T) func(*http.Response, error) string {
	return func(resp *http.Response, err error) string { return body(t, resp, err) }
}

// TestForwardOverStreams: a forward goes as a stream when the holder
// serves one; over HTTP, body whole, when it does not (a version 1 or
// long-poll agent there, a relay from before streams); and always over
// HTTP with an access code's ticket, which the holder spends.
func TestForwardOverStreams(t *testing.T) {
	s := &fakeState{known: true, routes: map[string]fleet.Target{"": r2}}
	peers := &fakePeers{}
	f := loopFleet(t, s, peers)
	streams := &fakeStreams{unavailable: map[string]bool{}}
	f.Streams = streams

	req, _ := http.NewRequest(http.MethodGet, "http://dev/x", nil)
	if got := read(t)(f.RoundTrip(req)); got != "stream "+r2.ID || len(peers.hits) != 0 {
		t.Errorf("holder with streams: %q, HTTP forwards %v", got, peers.hits)
	}

	streams.unavailable[r2.ID] = true
	req, _ = http.NewRequest(http.MethodPost, "http://dev/x", strings.NewReader("whole"))
	if got := read(t)(f.RoundTrip(req)); got != "r2" || len(peers.hits) != 1 || peers.hits[0] != "r2 1" {
		t.Errorf("holder without streams: %q, HTTP forwards %v; want r2 over HTTP, hop 1", got, peers.hits)
	}

	streams.unavailable[r2.ID] = false
	calls := len(streams.calls)
	req, _ = http.NewRequest(http.MethodGet, "http://dev/x", nil)
	req = req.WithContext(access.WithTicket(req.Context(), access.Ticket{Nonce: "n", Expires: time.Now().Add(time.Minute)}))
	if got := read(t)(f.RoundTrip(req)); got != "r2" || len(streams.calls) != calls {
		t.Errorf("a request with a ticket: %q, %d stream forwards; want it over HTTP", got, len(streams.calls)-calls)
	}
}

// TestLostStreamForward: a stream forward whose holder's session died
// under it vetoes the holder; a GET goes once more to the next holder, a
// POST fails with a 502 and goes nowhere else. An agent's refusal to
// reach its service is the user's answer as it is.
func TestLostStreamForward(t *testing.T) {
	for _, c := range []struct {
		method string
		err    error
		want   string // the answer's body, or "" for an error
		vetoed bool
	}{
		{http.MethodGet, mux.ErrSessionClosed, "stream " + r3.ID, true},
		{http.MethodPost, mux.ErrSessionClosed, "", true},
		{http.MethodGet, &mux.ResetError{Code: forward.CodeAgentLost, Remote: true}, "stream " + r3.ID, false},
		{http.MethodGet, &mux.OpenError{Err: mux.ErrGoAway}, "stream " + r2.ID, false},
		{http.MethodGet, &tunnel.ServiceError{Device: "dev", Service: "http", Code: tunnel.CodeServiceRefused}, "", false},
	} {
		s := &fakeState{known: true, routes: map[string]fleet.Target{"": r2, r2.ID: r3}}
		f := loopFleet(t, s, &fakePeers{})
		first := true
		streams := &fakeStreams{lost: map[string]error{}}
		f.Streams = oneShot{streams, &first, c.err}
		var b io.Reader
		if c.method == http.MethodPost {
			b = strings.NewReader("once only")
		}
		req, _ := http.NewRequest(c.method, "http://dev/x", b)
		resp, err := f.RoundTrip(req)
		var got string
		if err == nil {
			got = body(t, resp, nil)
		}
		var hs interface{ HTTPStatus() int }
		switch {
		case got != c.want:
			t.Errorf("%s after %v: %q, %v; want %q", c.method, c.err, got, err, c.want)
		case c.want == "" && (!errors.As(err, &hs) || hs.HTTPStatus() != http.StatusBadGateway):
			t.Errorf("%s after %v: %v, want a 502", c.method, c.err, err)
		case (len(s.vetoed) > 0) != c.vetoed:
			t.Errorf("%s after %v: vetoed %v, want vetoed %v", c.method, c.err, s.vetoed, c.vetoed)
		}
	}
}

// oneShot fails its first round trip with err, then passes on to next.
type oneShot struct {
	next  *fakeStreams
	first *bool
	err   error
}

func (o oneShot) RoundTrip(req *http.Request, holderID, address string) (*http.Response, error) {
	if *o.first {
		*o.first = false
		return nil, o.err
	}
	return o.next.RoundTrip(req, holderID, address)
}

// TestBusyAtTheHolder: a holder's refusal of a busy device is the user's
// 503 as it is, not a 502 of a forward that failed, and not tried elsewhere.
func TestBusyAtTheHolder(t *testing.T) {
	s := &fakeState{known: true, routes: map[string]fleet.Target{"": r2, r2.ID: r3}}
	f := loopFleet(t, s, &fakePeers{})
	first := true
	streams := &fakeStreams{}
	f.Streams = oneShot{streams, &first, &forward.BusyError{Device: "dev", Relay: r2.ID}}
	req, _ := http.NewRequest(http.MethodGet, "http://dev/x", nil)
	_, err := f.RoundTrip(req)
	var hs interface{ HTTPStatus() int }
	if !errors.As(err, &hs) || hs.HTTPStatus() != http.StatusServiceUnavailable || len(streams.calls) != 0 || len(s.vetoed) != 0 {
		t.Errorf("busy at the holder: %v, then %d more forwards, vetoed %v; want a 503 alone", err, len(streams.calls), s.vetoed)
	}
}
