package router

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// fakeState stands for what the router reads of this relay and the fleet,
// and records the vetoes it is told.
type fakeState struct {
	mu                 sync.Mutex // guards the fields below
	known, remembers   bool
	hasAgent           bool
	draining, stopping bool
	vetoed             []string
	changed            chan struct{}
	routes, holders    map[string]fleet.Target
}

func (s *fakeState) Known(string) bool     { s.mu.Lock(); defer s.mu.Unlock(); return s.known }
func (s *fakeState) HasAgent(string) bool  { s.mu.Lock(); defer s.mu.Unlock(); return s.hasAgent }
func (s *fakeState) Remembers(string) bool { s.mu.Lock(); defer s.mu.Unlock(); return s.remembers }
func (s *fakeState) Draining() bool        { s.mu.Lock(); defer s.mu.Unlock(); return s.draining }
func (s *fakeState) Stopping() bool        { s.mu.Lock(); defer s.mu.Unlock(); return s.stopping }

func (s *fakeState) Veto(id string, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vetoed = append(s.vetoed, id)
}

func (s *fakeState) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// change applies f to the state and wakes the waiters.
func (s *fakeState) change(f func(*fakeState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// fakeDirectory answers Route and Holder from maps keyed by the relay left
// out; Holder falls back to Route's map.
type fakeDirectory struct{ s *fakeState }

func (d fakeDirectory) Route(_, exclude string) (fleet.Target, bool) {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	t, ok := d.s.routes[exclude]
	return t, ok
}

func (d fakeDirectory) Holder(device, exclude string) (fleet.Target, bool) {
	d.s.mu.Lock()
	t, ok := d.s.holders[exclude]
	d.s.mu.Unlock()
	if !ok {
		return d.Route(device, exclude)
	}
	return t, ok
}

var (
	_ Directory = fakeDirectory{}
	_ Registry  = (*fakeState)(nil)
	_ Agents    = (*fakeState)(nil)
	_ Status    = (*fakeState)(nil)
	_ Vetoer    = (*fakeState)(nil)
	_ Changes   = (*fakeState)(nil)
)

// fakePeers is the other relays: each host answers with its name, or
// fails as refused holds; every forward is noted as "host hops".
type fakePeers struct {
	mu      sync.Mutex // guards hits
	refused map[string]bool
	hits    []string
}

func (p *fakePeers) RoundTrip(req *http.Request) (*http.Response, error) {
	p.mu.Lock()
	p.hits = append(p.hits, req.URL.Host+" "+req.Header.Get(peer.HopsHeader))
	p.mu.Unlock()
	if p.refused[req.URL.Host] {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	if req.Header.Get(peer.Header) == "" || !strings.HasPrefix(req.URL.Path, "/client/dev/") {
		return &http.Response{StatusCode: http.StatusBadRequest, Body: http.NoBody, Request: req}, nil
	}
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(req.URL.Host)), Request: req}, nil
}

// agentHere answers every request as this relay's agent of the device.
type agentHere struct{}

func (agentHere) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("here")), Request: req}, nil
}

// agentGone answers every request as a relay whose agent of the device
// has just gone.
type agentGone struct{}

func (agentGone) RoundTrip(req *http.Request) (*http.Response, error) {
	return nil, broker.NoAgentError(req.URL.Host)
}

// loopFleet is a Fleet over fakes: no socket is opened.
func loopFleet(t *testing.T, s *fakeState, peers *fakePeers) *Fleet {
	t.Helper()
	ring, err := secret.NewRing(secret.New())
	if err != nil {
		t.Fatal(err)
	}
	signer, err := peer.NewSigner(ring, "rl-00000001")
	if err != nil {
		t.Fatal(err)
	}
	f := &Fleet{
		Local:     &Local{Native: tunnel.NewPool(tunnel.Liveness{}, nil), LongPoll: agentHere{}},
		Directory: fakeDirectory{s},
		Registry:  s, Agents: s, Status: s, Vetoer: s, Changes: s,
		Signer: signer,
		Grace:  5 * time.Second,
		peers:  peers,
	}
	return f
}

var (
	self = fleet.Target{ID: "rl-00000001", Address: "http://r1", Self: true}
	r2   = fleet.Target{ID: "rl-00000002", Address: "http://r2"}
	r3   = fleet.Target{ID: "rl-00000003", Address: "http://r3"}
)

// TestRoundTripLoop walks Fleet.RoundTrip's loop over fakes: which relay
// answers, which relays were tried with which hop count, which were
// vetoed, and how long (in virtual time) the request waited.
func TestRoundTripLoop(t *testing.T) {
	for _, c := range []struct {
		name    string
		state   *fakeState
		hops    int                // hops the request already made
		refused []string           // peer hosts that refuse connections
		later   func(s *fakeState) // a change one second in, if any
		closing bool               // the agent here takes no request, though HasAgent says it is there
		answer  string             // "" for a 503 (no agent)
		tried   []string           // forwards, as "host hops"
		vetoed  []string
		waited  time.Duration
	}{
		{name: "an agent here", state: &fakeState{hasAgent: true, routes: map[string]fleet.Target{"": r2}},
			answer: "here"},
		{name: "an agent here that closes: the request waits for the fleet to say where the device went",
			state: &fakeState{known: true, hasAgent: true, routes: map[string]fleet.Target{"": self}}, closing: true,
			later: func(s *fakeState) { s.routes = map[string]fleet.Target{"": r3} }, answer: "r3", tried: []string{"r3 1"}, waited: time.Second},
		{name: "forwarded to the holder", state: &fakeState{routes: map[string]fleet.Target{"": r2}},
			answer: "r2", tried: []string{"r2 1"}},
		{name: "a refused holder is vetoed, the next relay answers", state: &fakeState{routes: map[string]fleet.Target{"": r2, r2.ID: r3}},
			refused: []string{"r2"}, answer: "r3", tried: []string{"r2 1", "r3 1"}, vetoed: []string{r2.ID}},
		{name: "every relay refuses", state: &fakeState{known: true, routes: map[string]fleet.Target{"": r2, r2.ID: r3}},
			refused: []string{"r2", "r3"}, tried: []string{"r2 1", "r3 1"}, vetoed: []string{r2.ID, r3.ID}, waited: 5 * time.Second},
		{name: "a device never seen answers 503 at once", state: &fakeState{}},
		{name: "a device between polls here waits for its agent", state: &fakeState{remembers: true},
			waited: 5 * time.Second},
		{name: "a known device waits the grace, then 503", state: &fakeState{known: true},
			waited: 5 * time.Second},
		{name: "the wait ends when an agent connects here", state: &fakeState{known: true},
			later: func(s *fakeState) { s.hasAgent = true }, answer: "here", waited: time.Second},
		{name: "the wait ends when another relay holds the device", state: &fakeState{known: true},
			later: func(s *fakeState) { s.routes = map[string]fleet.Target{"": r3} }, answer: "r3", tried: []string{"r3 1"}, waited: time.Second},
		{name: "the holder is this relay: wait for the agent", state: &fakeState{known: true, routes: map[string]fleet.Target{"": self}},
			waited: 5 * time.Second},
		{name: "the last hop does not forward again", state: &fakeState{known: true, routes: map[string]fleet.Target{"": r2}},
			hops: MaxHops, waited: 5 * time.Second},
		{name: "the second hop may still go on", state: &fakeState{routes: map[string]fleet.Target{"": r2}},
			hops: 1, answer: "r2", tried: []string{"r2 2"}},
		{name: "a draining holder sends the request after the agent", state: &fakeState{draining: true, known: true,
			routes: map[string]fleet.Target{"": self}, holders: map[string]fleet.Target{"": r3}},
			answer: "r3", tried: []string{"r3 2"}},
		{name: "a stopping holder too", state: &fakeState{stopping: true, known: true,
			routes: map[string]fleet.Target{"": self}, holders: map[string]fleet.Target{"": r3}},
			answer: "r3", tried: []string{"r3 2"}},
		{name: "a draining holder whose long-poll agent is between polls waits for it", state: &fakeState{draining: true, known: true, remembers: true,
			routes: map[string]fleet.Target{"": self}, holders: map[string]fleet.Target{"": r3}},
			waited: 5 * time.Second},
		{name: "a holder that does not drain waits for the agent", state: &fakeState{known: true,
			routes: map[string]fleet.Target{"": self}, holders: map[string]fleet.Target{"": r3}},
			waited: 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := c.state
				peers := &fakePeers{refused: map[string]bool{}}
				for _, h := range c.refused {
					peers.refused[h] = true
				}
				f := loopFleet(t, s, peers)
				if c.closing {
					f.Local.LongPoll = agentGone{}
				}
				ctx := context.Background()
				if c.hops > 0 {
					ctx = peer.WithForwarded(ctx, "rl-00000009", c.hops)
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://dev/x", nil)
				if err != nil {
					t.Fatal(err)
				}
				if c.later != nil {
					time.AfterFunc(time.Second, func() { s.change(c.later) }) // a second of virtual time
				}
				start := time.Now()
				resp, err := f.RoundTrip(req)
				waited := time.Since(start)
				got := ""
				switch {
				case err == nil:
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					got = string(b)
				case errors.Is(err, broker.ErrNoAgent):
					var se interface{ HTTPStatus() int }
					if !errors.As(err, &se) || se.HTTPStatus() != http.StatusServiceUnavailable {
						t.Errorf("no agent: %v, want a 503", err)
					}
				default:
					got = "error"
				}
				if got != c.answer {
					t.Errorf("answer %q (%v), want %q", got, err, c.answer)
				}
				if !slices.Equal(peers.hits, c.tried) || !slices.Equal(s.vetoed, c.vetoed) {
					t.Errorf("tried %v and vetoed %v, want %v and %v", peers.hits, s.vetoed, c.tried, c.vetoed)
				}
				if waited != c.waited {
					t.Errorf("waited %s, want %s", waited, c.waited)
				}
			})
		})
	}
}

// TestNextFollowsTheAgentOffALeavingRelay is the drain policy alone: a
// relay that drains or stops sends a request for a device the directory
// still gives it, but whose agent has gone, to where the agent is being
// placed, marked Final.
func TestNextFollowsTheAgentOffALeavingRelay(t *testing.T) {
	final := r3
	final.Final = true
	for _, c := range []struct {
		name  string
		state *fakeState
		want  fleet.Target
	}{
		{"not leaving", &fakeState{}, self},
		{"draining, no agent here", &fakeState{draining: true}, final},
		{"stopping, no agent here", &fakeState{stopping: true}, final},
		{"draining, its agent still here", &fakeState{draining: true, hasAgent: true}, self},
		{"draining, its long-poll agent between polls", &fakeState{draining: true, remembers: true}, self},
		{"draining, and the holder is still this relay", &fakeState{draining: true, holders: map[string]fleet.Target{"": self}}, self},
	} {
		s := c.state
		s.routes = map[string]fleet.Target{"": self}
		if s.holders == nil {
			s.holders = map[string]fleet.Target{"": r3}
		}
		f := &Fleet{Directory: fakeDirectory{s}, Agents: s, Status: s}
		if got, ok := f.next("dev", "", s.hasAgent); !ok || got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// A device held elsewhere goes there, leaving or not.
	s := &fakeState{draining: true, routes: map[string]fleet.Target{"": r2}, holders: map[string]fleet.Target{"": r3}}
	f := &Fleet{Directory: fakeDirectory{s}, Agents: s, Status: s}
	if got, _ := f.next("dev", "", s.hasAgent); got != r2 {
		t.Errorf("held elsewhere, draining: %+v, want %+v", got, r2)
	}
}
