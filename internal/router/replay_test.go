package router

import (
	"context"
	"errors"
	"fmt"
	"github.com/switchboard-relay/switchboard/internal/testkit"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/net/http2"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/replay"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// TestDecide is the table of what follows a failed attempt: which failures
// send a request elsewhere, which requests may be sent again after they may
// have reached the device, and that a second chance is spent once.
func TestDecide(t *testing.T) {
	var (
		refused  = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		reset    = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
		eof      = fmt.Errorf("relay x: %w", io.ErrUnexpectedEOF)
		goaway   = errors.New("http2: server sent GOAWAY and closed the connection; LastStreamID=3, ErrCode=NO_ERROR, debug=\"\"")
		rst      = http2.StreamError{StreamID: 3, Code: http2.ErrCodeInternal}
		unopened = errors.New("http2: client conn could not be established")
		refusedS = http2.StreamError{StreamID: 3, Code: http2.ErrCodeRefusedStream}
		canceled = fmt.Errorf("relay x: %w", context.Canceled)
		answer   = &forwardError{relay: "x", err: errors.New("tls: bad certificate")}
	)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	req := func(method string, body io.Reader, header ...string) func() *http.Request {
		return func() *http.Request {
			r, err := http.NewRequest(method, "http://dev/x", body)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(header); i += 2 {
				r.Header.Set(header[i], header[i+1])
			}
			return r
		}
	}
	get, post := req(http.MethodGet, nil), req(http.MethodPost, strings.NewReader("once"))
	type state struct{ reopened, replayed, informed bool }
	for _, c := range []struct {
		name  string
		err   error
		req   func() *http.Request
		st    state
		local bool
		want  action
	}{
		// Nothing was sent: any method moves.
		{"POST refused at connect", refused, post, state{}, false, elsewhere},
		{"POST on a new connection that closed unused", unopened, post, state{}, false, again},
		{"POST on a refused stream", refusedS, post, state{}, false, again},
		{"POST unopened twice", unopened, post, state{reopened: true}, false, giveUp},
		{"POST refused, its body read once", refused, req(http.MethodPost, io.NopCloser(strings.NewReader("x"))), state{}, false, giveUp},

		// The holder died with the request in flight.
		{"GET, connection reset", reset, get, state{}, false, replayElsewhere},
		{"GET, EOF", eof, get, state{}, false, replayElsewhere},
		{"HEAD, GOAWAY and a close", goaway, req(http.MethodHead, nil), state{}, false, replayElsewhere},
		{"OPTIONS, stream reset", rst, req(http.MethodOptions, nil), state{}, false, replayElsewhere},
		{"GET with a rewindable body", eof, req(http.MethodGet, strings.NewReader("q")), state{}, false, replayElsewhere},
		{"GET with a body read once", eof, req(http.MethodGet, io.NopCloser(strings.NewReader("q"))), state{}, false, giveUp},
		{"websocket before its 101", eof, req(http.MethodGet, nil, "Connection", "Upgrade", "Upgrade", "websocket"), state{}, false, replayElsewhere},
		{"POST", eof, post, state{}, false, giveUp},
		{"PUT", reset, req(http.MethodPut, strings.NewReader("x")), state{}, false, giveUp},
		{"DELETE", goaway, req(http.MethodDelete, nil), state{}, false, giveUp},
		{"GET replayed already", eof, get, state{replayed: true}, false, giveUp},
		{"GET after a 1xx went to the user", eof, get, state{informed: true}, false, giveUp},
		{"GET whose user went away", eof, func() *http.Request { return get().WithContext(gone) }, state{}, false, giveUp},

		// The agent's tunnel here died with the request in flight.
		{"GET, local tunnel lost", errors.New("http2: client connection lost"), get, state{}, true, replayElsewhere},
		{"POST, local tunnel lost", errors.New("http2: client connection lost"), post, state{}, true, giveUp},
		{"GET, local, replayed already", reset, get, state{replayed: true}, true, giveUp},
		{"GET, local, refused", refused, get, state{}, true, giveUp},

		// Not a lost connection: the answer goes to the user.
		{"GET cancelled by its user", canceled, get, state{}, false, giveUp},
		{"GET, a TLS failure", answer, get, state{}, false, giveUp},
	} {
		st := &attempts{reopened: c.st.reopened, replayed: c.st.replayed}
		st.informed.Store(c.st.informed)
		if got := decide(replay.Classify(c.err), c.req(), st, c.local); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func (a action) String() string {
	return [...]string{giveUp: "giveUp", again: "again", elsewhere: "elsewhere", replayElsewhere: "replayElsewhere"}[a]
}

// dyingHolder is a relay that takes a request and dies without answering:
// it reads the HTTP/2 request's HEADERS and closes the connection.
func dyingHolder(t *testing.T, hits *atomic.Int64) string {
	t.Helper()
	return "http://" + testkit.ServeTCP(t, func(c net.Conn) {
		if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(c, c)
		fr.WriteSettings()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if _, ok := f.(*http2.HeadersFrame); ok {
				hits.Add(1)
				return // dies with the request in flight
			}
		}
	})
}

// testFleet is a Fleet whose holders are given by the test, with the
// device held elsewhere (no agent here) unless local says.
func testFleet(t *testing.T, holders map[string]fleet.Target, local http.RoundTripper) (*Fleet, *[]string) {
	t.Helper()
	ring, err := secret.NewRing(secret.New())
	if err != nil {
		t.Fatal(err)
	}
	signer, err := peer.NewSigner(ring, "rl-00000001")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeState{known: true, hasAgent: local != nil}
	f := NewFleet(nil)
	t.Cleanup(f.Close)
	f.Local = &Local{Native: tunnel.NewPool(tunnel.Liveness{}, nil), LongPoll: local}
	f.Directory = holderMap(holders)
	f.Registry, f.Agents, f.Status, f.Vetoer, f.Changes = fs, fs, fs, fs, fs
	f.Signer = signer
	return f, &fs.vetoed
}

// holderMap is a Directory whose answers, the same for Route and Holder,
// are by the relay left out.
type holderMap map[string]fleet.Target

func (m holderMap) Route(_, exclude string) (fleet.Target, bool) {
	h, ok := m[exclude]
	return h, ok
}

func (m holderMap) Holder(device, exclude string) (fleet.Target, bool) {
	return m.Route(device, exclude)
}

// TestLostForwardGoesOnceToTheNewHolder forwards to a holder that dies
// with the request in flight: a GET goes on to the device's next holder,
// which answers, and the dead one is vetoed; a POST fails with a 502 and
// never reaches the next holder.
func TestLostForwardGoesOnceToTheNewHolder(t *testing.T) {
	var died, answered atomic.Int64
	next := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answered.Add(1)
		io.WriteString(w, "the next holder")
	}))
	next.Config.Protocols = new(http.Protocols)
	next.Config.Protocols.SetUnencryptedHTTP2(true)
	next.Start()
	t.Cleanup(next.Close)
	holders := map[string]fleet.Target{
		"":            {ID: "rl-dead0001", Address: dyingHolder(t, &died)},
		"rl-dead0001": {ID: "rl-next0001", Address: next.URL},
	}

	f, vetoed := testFleet(t, holders, nil)
	req, _ := http.NewRequest(http.MethodGet, "http://dev/x", nil)
	resp, err := f.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET whose holder died: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "the next holder" || died.Load() != 1 {
		t.Fatalf("GET: %q, the dead holder took %d requests", b, died.Load())
	}
	if len(*vetoed) != 1 || (*vetoed)[0] != "rl-dead0001" {
		t.Errorf("vetoed %v, want the dead holder", *vetoed)
	}

	f, _ = testFleet(t, holders, nil)
	req, _ = http.NewRequest(http.MethodPost, "http://dev/x", strings.NewReader("once only"))
	_, err = f.RoundTrip(req)
	var se interface{ HTTPStatus() int }
	if !errors.As(err, &se) || se.HTTPStatus() != http.StatusBadGateway || replay.Classify(err) != replay.Lost {
		t.Fatalf("POST whose holder died: %v, want a lost forward (502)", err)
	}
	if answered.Load() != 1 || died.Load() != 2 {
		t.Errorf("after the POST the next holder answered %d requests, the dead one took %d; want 1 and 2", answered.Load(), died.Load())
	}
}

// lossyAgent stands for this relay's agents: its first request is lost
// with its tunnel (after a 1xx when informed), later ones are answered.
type lossyAgent struct {
	calls    atomic.Int64
	informed bool
}

func (a *lossyAgent) RoundTrip(req *http.Request) (*http.Response, error) {
	if a.calls.Add(1) == 1 {
		if trace := httptrace.ContextClientTrace(req.Context()); a.informed && trace != nil && trace.Got1xxResponse != nil {
			trace.Got1xxResponse(http.StatusEarlyHints, nil)
		}
		return nil, errors.New("http2: client connection lost")
	}
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("agent")), Request: req}, nil
}

// TestLostTunnelGoesOnceToWhereTheDeviceIs loses a request with the
// agent's tunnel on the relay holding the device: a GET is sent once more
// to the device's agent (here, another or the same one back), a POST, or a
// GET after a 1xx went to the user, is not.
func TestLostTunnelGoesOnceToWhereTheDeviceIs(t *testing.T) {
	for _, c := range []struct {
		method   string
		informed bool
		calls    int64
		ok       bool
	}{
		{http.MethodGet, false, 2, true},
		{http.MethodHead, false, 2, true},
		{http.MethodPost, false, 1, false},
		{http.MethodGet, true, 1, false},
	} {
		agent := &lossyAgent{informed: c.informed}
		f, _ := testFleet(t, nil, agent)
		req, _ := http.NewRequest(c.method, "http://dev/x", nil)
		resp, err := f.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		if (err == nil) != c.ok || agent.calls.Load() != c.calls {
			t.Errorf("%s (1xx first: %v): %v after %d calls; want ok %v after %d", c.method, c.informed, err, agent.calls.Load(), c.ok, c.calls)
		}
	}
}
