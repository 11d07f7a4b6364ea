package forward

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/replay"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/splice"
	"github.com/switchboard-relay/switchboard/internal/testkit"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// agent is a device's version 2 agent on the holder, over a real
// connection: the holder's end opens streams, the agent's end dials the
// backend for each and copies bytes, or resets it with refuse when set.
type agent struct {
	relay   *mux.Session
	svc     service.Announced
	open    atomic.Int64 // streams being copied
	refuse  uint32
	leaving context.Context
	leave   context.CancelFunc
}

func newAgent(t *testing.T, backend string, svc service.Announced) *agent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialled, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{svc: svc}
	a.leaving, a.leave = context.WithCancel(context.Background())
	a.relay = mux.New(accepted, mux.Config{RefuseStreams: true})
	dev := mux.New(dialled, mux.Config{Client: true})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			st, err := dev.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				if a.refuse != 0 {
					st.Reset(a.refuse)
					return
				}
				c, err := net.Dial("tcp", backend)
				if err != nil {
					st.Reset(tunnel.CodeServiceUnreachable)
					return
				}
				a.open.Add(1)
				defer a.open.Add(-1)
				splice.Join(st, c)
			})
		}
	})
	t.Cleanup(func() {
		a.leave()
		a.relay.Close()
		dev.Close()
		wg.Wait()
	})
	return a
}

// OpenHTTP opens a stream to the agent, or refuses with ErrNoAgent when
// the agent is nil (a version 1 agent).
func (a *agent) OpenHTTP(ctx context.Context, device string) (*tunnel.HTTPStream, error) {
	if a == nil || device != "dev" {
		return nil, tunnel.ErrNoAgent
	}
	st, err := a.relay.Open(ctx, []byte(service.Default))
	if err != nil {
		return nil, err
	}
	return &tunnel.HTTPStream{Stream: st, Service: a.svc, Leaving: a.leaving}, nil
}

// nobody is a holder with no version 2 agent.
type nobody struct{}

func (nobody) OpenHTTP(context.Context, string) (*tunnel.HTTPStream, error) {
	return nil, tunnel.ErrNoAgent
}

func signer(t *testing.T, s []byte, id string) *peer.Signer {
	t.Helper()
	ring, err := secret.NewRing(s)
	if err != nil {
		t.Fatal(err)
	}
	sg, err := peer.NewSigner(ring, id)
	if err != nil {
		t.Fatal(err)
	}
	return sg
}

// fixture is a holder (a forward Server on a real HTTP server) and a
// forwarding relay's Forwarder, both with the fleet secret.
type fixture struct {
	holder   *Server
	url      string
	f        *Forwarder
	sessions atomic.Int64 // upgrades the holder's listener took
}

func newFixture(t *testing.T, open Opener, forwarderSecret []byte) *fixture {
	t.Helper()
	fleetSecret := secret.New()
	if forwarderSecret == nil {
		forwarderSecret = fleetSecret
	}
	fx := &fixture{holder: &Server{Open: open, Verify: signer(t, fleetSecret, "rl-00000002").VerifySignature}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fx.sessions.Add(1)
		fx.holder.ServeHTTP(w, r)
	}))
	fx.url = srv.URL
	fx.f = NewForwarder(Config{Sign: signer(t, forwarderSecret, "rl-00000001").Signature})
	t.Cleanup(func() {
		fx.f.Close()
		fx.holder.Close()
		srv.Close()
	})
	return fx
}

func (fx *fixture) do(method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequest(method, "http://dev"+path, body)
	if err != nil {
		return nil, err
	}
	req.Host = "users.example"
	return fx.f.RoundTrip(req, "rl-00000002", fx.url)
}

// backend answers with what it got: method, Host, path and body.
func backend(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s %s", r.Method, r.Host, r.URL.Path, b)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// answer returns the body of the answer to a request through the holder.
func (fx *fixture) answer(t *testing.T, method, path string, body io.Reader) string {
	t.Helper()
	resp, err := fx.do(method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRequestsOverOneStream: requests through the holder reach the agent's
// service with the announced path and Host, over one pooled stream.
func TestRequestsOverOneStream(t *testing.T) {
	a := newAgent(t, backend(t), service.Announced{Name: "http", Kind: service.HTTP, Path: "/base", Host: "device.local"})
	fx := newFixture(t, a, nil)
	for i := range 3 {
		got := fx.answer(t, http.MethodPost, "/x", strings.NewReader(fmt.Sprint(i)))
		if want := fmt.Sprintf("POST device.local /base/x %d", i); got != want {
			t.Errorf("request %d: %q, want %q", i, got, want)
		}
	}
	if n := fx.f.Streams(); n != 1 {
		t.Errorf("%d streams for three requests one after another, want 1", n)
	}

	// Open hands the stream and the announcement to a client of one's own.
	conn, svc, err := fx.f.Open(t.Context(), "rl-00000002", fx.url, "dev")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if svc.Path != "/base" || svc.Host != "device.local" {
		t.Errorf("announcement %+v", svc)
	}
	io.WriteString(conn, "GET "+svc.Path+"/raw HTTP/1.1\r\nHost: "+svc.Host+"\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "GET device.local /base/raw " {
		t.Errorf("over an opened stream: %q", b)
	}
}

// TestUnavailable: a holder with no version 2 agent of the device resets
// the stream, and the forwarder says so without reading the request's
// body, so that it goes over HTTP whole; it does not ask again at once.
func TestUnavailable(t *testing.T) {
	fx := newFixture(t, nobody{}, nil)
	body := strings.NewReader("whole")
	_, err := fx.do(http.MethodPost, "/x", io.NopCloser(body))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no agent at the holder: %v, want ErrUnavailable", err)
	}
	if body.Len() != len("whole") {
		t.Errorf("%d bytes of the body left, want all of it", body.Len())
	}
	if _, err := fx.do(http.MethodGet, "/x", nil); !errors.Is(err, ErrUnavailable) || fx.f.Streams() != 1 {
		t.Errorf("again at once: %v after %d streams; want ErrUnavailable without a new stream", err, fx.f.Streams())
	}
}

// switchable is an opener whose agent can go: nil opens nothing.
type switchable struct {
	mu sync.Mutex
	a  *agent
}

func (s *switchable) set(a *agent) { s.mu.Lock(); s.a = a; s.mu.Unlock() }

func (s *switchable) OpenHTTP(ctx context.Context, device string) (*tunnel.HTTPStream, error) {
	s.mu.Lock()
	a := s.a
	s.mu.Unlock()
	return a.OpenHTTP(ctx, device)
}

// TestAgentGoneBetweenRequests: when the holder no longer has a version 2
// agent of the device (it came back as version 1), the next request that
// needs a new stream is told ErrUnavailable with its body unread, though
// the forwarder had a client for the device already.
func TestAgentGoneBetweenRequests(t *testing.T) {
	a := newAgent(t, backend(t), service.Announced{Name: "http", Kind: service.HTTP})
	open := &switchable{a: a}
	fx := newFixture(t, open, nil)
	fx.answer(t, http.MethodGet, "/x", nil)
	open.set(nil)
	a.relay.Close() // the agent's session ends, and the pooled stream with it
	testkit.Eventually(t, 5*time.Second, func() error {
		body := strings.NewReader("whole")
		_, err := fx.do(http.MethodPost, "/x", io.NopCloser(body))
		switch {
		case err == nil:
			return errors.New("answered without an agent")
		case !errors.Is(err, ErrUnavailable):
			return err // the pooled stream's end, seen first
		case body.Len() != len("whole"):
			t.Fatalf("%d bytes of the body left, want all of it", body.Len())
		}
		return nil
	})
}

// TestOlderHolder: a relay from before stream forwards refuses the
// upgrade; the forwarder says ErrUnavailable and does not ask it again at
// once. So does a holder that refuses the session's signature (another
// fleet secret): the request goes over HTTP, which answers why.
func TestOlderHolder(t *testing.T) {
	var upgrades atomic.Int64
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upgrades.Add(1)
		http.NotFound(w, r)
	}))
	defer old.Close()
	f := NewForwarder(Config{Sign: signer(t, secret.New(), "rl-00000001").Signature})
	defer f.Close()
	for range 2 {
		req, _ := http.NewRequest(http.MethodGet, "http://dev/x", nil)
		if _, err := f.RoundTrip(req, "rl-00000002", old.URL); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("an older holder: %v, want ErrUnavailable", err)
		}
	}
	if n := upgrades.Load(); n != 1 {
		t.Errorf("the older holder was asked %d times, want once", n)
	}

	fx := newFixture(t, nobody{}, secret.New())
	if _, err := fx.do(http.MethodGet, "/x", nil); !errors.Is(err, ErrUnavailable) {
		t.Errorf("another fleet secret: %v, want ErrUnavailable", err)
	}
}

// TestServiceRefused: the agent's refusal to reach its service reaches
// the forwarding relay as the *tunnel.ServiceError it is.
func TestServiceRefused(t *testing.T) {
	a := newAgent(t, backend(t), service.Announced{Name: "http", Kind: service.HTTP})
	a.refuse = tunnel.CodeServiceRefused
	fx := newFixture(t, a, nil)
	_, err := fx.do(http.MethodGet, "/x", nil)
	var se *tunnel.ServiceError
	if !errors.As(err, &se) || se.Code != tunnel.CodeServiceRefused {
		t.Fatalf("refused service: %v, want a *tunnel.ServiceError", err)
	}
}

// TestRetire: when the agent's session is asked to go, the pooled stream
// spliced onto it is closed at once rather than when idle streams time out
// (30 s), so that the session can end.
func TestRetire(t *testing.T) {
	a := newAgent(t, backend(t), service.Announced{Name: "http", Kind: service.HTTP})
	fx := newFixture(t, a, nil)
	fx.answer(t, http.MethodGet, "/x", nil)
	if n := a.open.Load(); n != 1 {
		t.Fatalf("%d streams at the agent after a request, want the pooled one", n)
	}
	a.leave()
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := a.open.Load(); n != 0 {
			return fmt.Errorf("%d streams still open at the agent", n)
		}
		return nil
	})
	// A new request opens a new stream.
	if got := fx.answer(t, http.MethodGet, "/y", nil); got != "GET users.example /y " {
		t.Errorf("after the retirement: %q", got)
	}
}

// TestHolderGone: a holder that goes away with a request in flight loses
// it (package replay's Lost: it may have reached the device), and one
// that is gone refuses the next (Refused), so that the router vetoes it.
func TestHolderGone(t *testing.T) {
	arrived := make(chan struct{})
	stall := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
	}))
	defer stall.Close()
	a := newAgent(t, strings.TrimPrefix(stall.URL, "http://"), service.Announced{Name: "http", Kind: service.HTTP})
	fx := newFixture(t, a, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := fx.do(http.MethodGet, "/x", nil)
		errc <- err
	}()
	<-arrived
	fx.holder.Close()
	if err := <-errc; replay.Classify(err) != replay.Lost && replay.Classify(err) != replay.Reset {
		t.Errorf("request in flight at a holder that went: %v (%v), want it lost", err, replay.Classify(err))
	}
}

// TestSessionRefusals: the endpoint answers 426 to anything but its
// upgrade, and 401 to an upgrade without a valid session signature, before
// taking the connection.
func TestSessionRefusals(t *testing.T) {
	fx := newFixture(t, nobody{}, nil)
	for _, c := range []struct {
		name   string
		header http.Header
		want   int
	}{
		{"no upgrade", http.Header{}, http.StatusUpgradeRequired},
		{"unsigned", http.Header{"Connection": {"Upgrade"}, "Upgrade": {Protocol}}, http.StatusUnauthorized},
		{"signed for a device", http.Header{"Connection": {"Upgrade"}, "Upgrade": {Protocol},
			peer.Header: {signer(t, secret.New(), "rl-00000001").Signature("dev")}}, http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest(http.MethodGet, fx.url+Path, nil)
		req.Header = c.header
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", c.name, resp.StatusCode, c.want)
		}
	}
}

// FuzzOpening feeds the holder's decoders, a stream's opening and the
// announcement, arbitrary bytes: they refuse what they cannot read and
// never panic; what they read, they read back the same.
func FuzzOpening(f *testing.F) {
	f.Add([]byte("dev v2 rl-00000001 1764633600 ab12 00ff"), []byte{0, 2, '{', '}'})
	var pre bytes.Buffer
	writePreamble(&pre, service.Announced{Name: "http", Kind: service.HTTP, H2C: true, Path: "/p", Broadcast: []string{"/v"}})
	f.Add([]byte("retire 7"), pre.Bytes())
	f.Fuzz(func(t *testing.T, meta, preamble []byte) {
		if device, sig, err := parseOpen(meta); err == nil {
			if d, s, err := parseOpen(openMeta(device, sig)); err != nil || d != device || s != sig {
				t.Errorf("opening %q read back as %q %q, %v", meta, d, s, err)
			}
		}
		parseRetire(meta)
		svc, _, err := readPreamble(bytes.NewReader(preamble))
		if err != nil {
			return
		}
		var again bytes.Buffer
		if err := writePreamble(&again, svc); err != nil {
			t.Fatal(err)
		}
		if back, _, err := readPreamble(&again); err != nil || back.Path != svc.Path || back.H2C != svc.H2C {
			t.Errorf("announcement %+v read back as %+v, %v", svc, back, err)
		}
	})
}

// busy is a holder whose device is at its limit of requests in flight.
type busy struct{}

func (busy) OpenHTTP(_ context.Context, device string) (*tunnel.HTTPStream, error) {
	return nil, &tunnel.BusyError{Device: device, DeviceCap: 1}
}

// TestBusyDevice: a device at its limit on the holder is the user's 503
// with Retry-After at once, not a forward over HTTP to the same answer.
func TestBusyDevice(t *testing.T) {
	fx := newFixture(t, busy{}, nil)
	_, err := fx.do(http.MethodGet, "/x", nil)
	var hs interface{ HTTPStatus() int }
	if !errors.Is(err, tunnel.ErrBusy) || errors.Is(err, ErrUnavailable) || !errors.As(err, &hs) || hs.HTTPStatus() != http.StatusServiceUnavailable {
		t.Fatalf("busy device: %v, want a 503 that is not ErrUnavailable", err)
	}
}

// TestRetireSkipsUpgrades: a websocket spliced onto a session that is
// asked to go keeps running, and the device's other requests are not sent
// with Connection: close for as long as it does: an upgraded stream never
// carries another request, so it is not waited for.
func TestRetireSkipsUpgrades(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			fmt.Fprintf(w, "close=%v", r.Close)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	}))
	defer srv.Close()
	a := newAgent(t, strings.TrimPrefix(srv.URL, "http://"), service.Announced{Name: "http", Kind: service.HTTP})
	fx := newFixture(t, a, nil)
	if got := fx.answer(t, http.MethodGet, "/x", nil); got != "close=false" {
		t.Fatalf("first request: %q", got)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://dev/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := fx.f.RoundTrip(req, "rl-00000002", fx.url)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	ws := resp.Body.(io.ReadWriteCloser)
	defer ws.Close()
	a.leave()
	testkit.Eventually(t, 5*time.Second, func() error {
		if n, want := fx.f.notices.Load(), fx.f.Streams(); n != want {
			return fmt.Errorf("%d notices to retire a stream of %d", n, want)
		}
		return nil
	})
	testkit.Eventually(t, 5*time.Second, func() error {
		if got := fx.answer(t, http.MethodGet, "/y", nil); got != "close=false" {
			return fmt.Errorf("while the websocket runs: %q, want the requests' streams kept", got)
		}
		return nil
	})
	io.WriteString(ws, "still here")
	b := make([]byte, len("still here"))
	if _, err := io.ReadFull(ws, b); err != nil || string(b) != "still here" {
		t.Errorf("the websocket after the retirement: %q, %v", b, err)
	}
}
