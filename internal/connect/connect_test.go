package connect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// services dials real TCP services on loopback by name, as a holder's
// agent would.
type services struct {
	device string
	addrs  map[string]string
}

func (s services) Open(ctx context.Context, t Target) (net.Conn, error) {
	if t.Device != s.device {
		return nil, ErrNoDevice
	}
	if t.Service == "late" {
		return lateRefusal{}, nil
	}
	addr, ok := s.addrs[t.Service]
	if !ok {
		return nil, fmt.Errorf("%s: %w", t, ErrUnknownService)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	return c, nil
}

// lateRefusal is a service's side whose refusal shows only once used, as
// a stream opened without a round trip through an agent or another relay.
type lateRefusal struct{ net.Conn }

func (lateRefusal) Read([]byte) (int, error)         { return 0, fmt.Errorf("the agent says: %w", ErrRefused) }
func (lateRefusal) Write(p []byte) (int, error)      { return len(p), nil }
func (lateRefusal) Close() error                     { return nil }
func (lateRefusal) SetDeadline(time.Time) error      { return nil }
func (lateRefusal) SetReadDeadline(time.Time) error  { return nil }
func (lateRefusal) SetWriteDeadline(time.Time) error { return nil }

// echo serves each connection's bytes back, then half-closes.
func echo(t *testing.T) string {
	return testkit.ServeTCP(t, func(c net.Conn) {
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
	})
}

// closedPort returns an address where nothing listens.
func closedPort(t *testing.T) string {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

type fixture struct {
	client   *Client
	upgrades *atomic.Int32
}

func setup(t *testing.T, token string) fixture {
	h := &Handler{
		Open: services{device: "robot", addrs: map[string]string{"echo": echo(t), "down": closedPort(t)}},
		Authorize: func(r *http.Request) (Allow, error) {
			if r.Header.Get("Authorization") != "Bearer good" {
				return nil, &StatusError{Code: http.StatusUnauthorized, Msg: "no valid user token: pass --token-file"}
			}
			return func(t Target) error {
				if t.Service == "secret" {
					return ErrForbidden
				}
				return nil
			}, nil
		},
	}
	var upgrades atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path {
			http.NotFound(w, r)
			return
		}
		upgrades.Add(1)
		h.ServeHTTP(w, r)
	}))
	u, _ := url.Parse(srv.URL)
	c := NewClient(ClientConfig{Relay: u, Token: token})
	t.Cleanup(func() {
		c.Close()
		srv.CloseClientConnections()
		srv.Close()
	})
	return fixture{client: c, upgrades: &upgrades}
}

// Many connections, one upgrade: each is a stream on the client's one
// connection to the relay, and each gets its own bytes back after a
// half-close.
func TestManyConnectionsOneUpgrade(t *testing.T) {
	f := setup(t, "good")
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Go(func() {
			conn, err := f.client.Dial(context.Background(), Target{Device: "robot", Service: "echo"})
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			msg := strings.Repeat(fmt.Sprint(i), 1000*i)
			go func() {
				conn.Write([]byte(msg))
				conn.(interface{ CloseWrite() error }).CloseWrite()
			}()
			got, err := io.ReadAll(conn)
			if err != nil || string(got) != msg {
				errs <- fmt.Errorf("connection %d: %d bytes back, %v", i, len(got), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := f.upgrades.Load(); n != 1 {
		t.Errorf("%d upgrades for 50 connections, want 1", n)
	}
}

// Each refusal reaches the user as what it is.
func TestRefusalsSayWhy(t *testing.T) {
	f := setup(t, "good")
	for _, tc := range []struct {
		target Target
		want   error
	}{
		{Target{Device: "robot", Service: "nope"}, ErrUnknownService},
		{Target{Device: "other", Service: "echo"}, ErrNoDevice},
		{Target{Device: "robot", Service: "secret"}, ErrForbidden},
		{Target{Device: "robot", Service: "down"}, ErrRefused},
		{Target{Device: "robot", Service: "late"}, ErrRefused},
	} {
		conn, err := f.client.Dial(context.Background(), tc.target)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Read(make([]byte, 1))
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: read error %v, want %v", tc.target, err, tc.want)
		}
		conn.Close()
	}
	// The connection to the fleet survives them.
	conn, _ := f.client.Dial(context.Background(), Target{Device: "robot", Service: "echo"})
	defer conn.Close()
	conn.Write([]byte("still here"))
	buf := make([]byte, 10)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "still here" {
		t.Fatalf("after the refusals: %q, %v", buf, err)
	}
}

func TestBadCredentialRefusedAtTheUpgrade(t *testing.T) {
	f := setup(t, "bad")
	_, err := f.client.Dial(context.Background(), Target{Device: "robot", Service: "echo"})
	var he *HandshakeError
	if !errors.As(err, &he) || he.Status != http.StatusUnauthorized || !strings.Contains(he.Message, "--token-file") {
		t.Fatalf("dial with a bad token: %v", err)
	}
}

func TestNotAnUpgrade(t *testing.T) {
	h := &Handler{}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	if rec.Code != http.StatusUpgradeRequired || !strings.Contains(rec.Body.String(), "switchboard connect") {
		t.Fatalf("%d %q", rec.Code, rec.Body.String())
	}
}

func TestParseTarget(t *testing.T) {
	for in, ok := range map[string]bool{
		"robot-1/ssh": true, "lab.rig/db": true, "robot": false, "/ssh": false, "robot/": false,
		"robot/SSH": false, "a/b/c": false, "ro bot/ssh": false,
	} {
		if _, err := ParseTarget(in); (err == nil) != ok {
			t.Errorf("ParseTarget(%q): %v", in, err)
		}
	}
}

// A client speaks as soon as the 101 arrives: its first frames are never
// taken for bytes sent too early, on any of many fresh connections.
func TestFirstFramesRightAfterThe101(t *testing.T) {
	f := setup(t, "good")
	u := f.client.cfg.Relay
	for i := range 100 {
		c := NewClient(ClientConfig{Relay: u, Token: "good"})
		conn, err := c.Dial(context.Background(), Target{Device: "robot", Service: "echo"})
		if err == nil {
			conn.Write([]byte("hi"))
			buf := make([]byte, 2)
			_, err = io.ReadFull(conn, buf)
		}
		c.Close()
		if err != nil {
			t.Fatalf("fresh connection %d: %v", i, err)
		}
	}
}

// The end of the upgrade request's context (a revoked credential, the
// relay stopping) ends the session and its streams.
func TestRequestEndEndsTheSession(t *testing.T) {
	end := make(chan struct{})
	h := &Handler{
		Open:      services{device: "robot", addrs: map[string]string{"echo": echo(t)}},
		Authorize: func(*http.Request) (Allow, error) { return func(Target) error { return nil }, nil },
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		go func() {
			select {
			case <-end:
				cancel()
			case <-ctx.Done():
			}
		}()
		h.ServeHTTP(w, r.WithContext(ctx))
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	c := NewClient(ClientConfig{Relay: u})
	defer c.Close()
	conn, err := c.Dial(context.Background(), Target{Device: "robot", Service: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("hi"))
	if _, err := io.ReadFull(conn, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	close(end)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the session outlived its request: %v", err)
	}
}

// TestStreamNames: a stream names its target's network after the service
// for UDP and passthrough, and nothing else is taken.
func TestStreamNames(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Target
		ok   bool
	}{
		{"robot/ssh", Target{Device: "robot", Service: "ssh", Network: TCP}, true},
		{"robot/voice/udp", Target{Device: "robot", Service: "voice", Network: UDP}, true},
		{"robot/web/passthrough", Target{Device: "robot", Service: "web", Network: Passthrough}, true},
		{"robot/voice/sctp", Target{}, false},
		{"robot/voice/udp/x", Target{}, false},
		{"robot//udp", Target{}, false},
		{"/voice/udp", Target{}, false},
	} {
		got, err := parseMeta(tc.in)
		if (err == nil) != tc.ok || tc.ok && got != tc.want {
			t.Errorf("parseMeta(%q) = %+v, %v", tc.in, got, err)
		}
		if tc.ok {
			if back, _ := parseMeta(got.meta()); back != got {
				t.Errorf("%q: meta %q reads back as %+v", tc.in, got.meta(), back)
			}
		}
	}
}

// TestSessionThatTakesNoMoreStreams: when the relay's end takes no new
// stream (a GOAWAY; or the ids ran out), the client opens the next stream
// on a new session, and closes the old one once its streams have ended.
func TestSessionThatTakesNoMoreStreams(t *testing.T) {
	var sessions atomic.Int32
	var wg sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, ok := Hijack(w, Protocol)
		if !ok {
			return
		}
		sess := mux.New(conn, mux.Config{})
		defer sess.Close()
		n := sessions.Add(1)
		for {
			st, err := sess.Accept()
			if err != nil {
				return
			}
			if n == 1 {
				sess.GoAway(0) // the first session takes its first stream only
			}
			wg.Go(func() { io.Copy(st, st); st.CloseWrite() })
		}
	}))
	defer srv.Close()
	defer wg.Wait()
	u, _ := url.Parse(srv.URL)
	c := NewClient(ClientConfig{Relay: u})
	defer c.Close()
	first, err := c.Open(t.Context(), []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	first.Write([]byte("x"))
	io.ReadFull(first, make([]byte, 1)) // the GOAWAY has come by now
	testkit.Eventually(t, 5*time.Second, func() error {
		st, err := c.Open(t.Context(), []byte("b"))
		if err != nil {
			return err
		}
		defer st.Close()
		if sessions.Load() != 2 {
			return fmt.Errorf("%d sessions", sessions.Load())
		}
		return nil
	})
	first.CloseWrite()
	io.ReadAll(first)
	first.Close()
}
