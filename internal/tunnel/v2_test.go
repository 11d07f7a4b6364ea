package tunnel

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// streamAgent serves a version 2 tunnel on conn as an agent whose service
// service.Default is at addr, until the test ends.
func streamAgent(t *testing.T, conn net.Conn, addr string) {
	t.Helper()
	serveAgent(t, conn, func(ctx context.Context, name string) (net.Conn, error) {
		if name != service.Default {
			return nil, service.ErrUnknown
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
}

// serveAgent runs ServeStreams on conn with dial until the test ends.
func serveAgent(t *testing.T, conn net.Conn, dial DialService) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeStreams(ctx, conn, Liveness{}, dial)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// relayV2 starts a relay endpoint over a real listener and returns its
// pool and URL.
func relayV2(t *testing.T, v1Only bool) (*Pool, *url.URL) {
	t.Helper()
	pool := NewPool(Liveness{}, nil)
	h := &Handler{Pool: pool, Authorize: func(*http.Request, string) (string, error) { return "", nil }, V1Only: v1Only}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		pool.Close()
		srv.Close()
	})
	u, _ := url.Parse(srv.URL)
	return pool, u
}

func announce(t *testing.T, services ...service.Service) string {
	t.Helper()
	a, err := service.Announce(services, false)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestV2HandshakeAndFallback: a version 2 offer gets version 2 from a
// relay that has it, and 400 (ErrNotSupported, so that the agent asks
// again for version 1) from a relay that knows only version 1, which takes
// version 1 alone.
func TestV2HandshakeAndFallback(t *testing.T) {
	ann := announce(t, service.Service{Name: service.Default, Kind: service.HTTP, Addr: "127.0.0.1:1"})
	for _, v1Only := range []bool{false, true} {
		pool, u := relayV2(t, v1Only)
		conn, err := Dial(context.Background(), DialConfig{Relay: u, Device: "dev", Version: V2, Services: ann}, nil)
		if v1Only {
			if !errors.Is(err, ErrNotSupported) {
				t.Fatalf("old relay: %v, want ErrNotSupported", err)
			}
			conn, err = Dial(context.Background(), DialConfig{Relay: u, Device: "dev", Version: V1}, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := V2
		if v1Only {
			want = V1
		}
		if got := VersionOf(conn); got != want {
			t.Fatalf("v1Only=%v: version %d, want %d", v1Only, got, want)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if !pool.Has("dev") {
				return errors.New("no session yet")
			}
			return nil
		})
		conn.Close()
	}
}

// TestV2RefusesBadAnnouncement: a version 2 offer without its services,
// or with services that do not parse, gets 400 and no tunnel.
func TestV2RefusesBadAnnouncement(t *testing.T) {
	_, u := relayV2(t, false)
	for _, ann := range []string{"", "{", `[{"name":"BAD","kind":"http"}]`} {
		_, err := Dial(context.Background(), DialConfig{Relay: u, Device: "dev", Version: V2, Services: ann}, nil)
		if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "400") {
			t.Fatalf("announcement %q: %v, want a 400", ann, err)
		}
	}
}

// v2Session dials a version 2 tunnel from an agent serving backend and
// returns the relay's pool once the session has joined.
func v2Session(t *testing.T, backend string, services ...service.Service) *Pool {
	t.Helper()
	return v2SessionDial(t, func(conn net.Conn) { streamAgent(t, conn, backend) }, services...)
}

// v2SessionDial is v2Session with the agent's serving given.
func v2SessionDial(t *testing.T, serve func(net.Conn), services ...service.Service) *Pool {
	t.Helper()
	pool, u := relayV2(t, false)
	conn, err := Dial(context.Background(), DialConfig{Relay: u, Device: "dev", Version: V2, Services: announce(t, services...)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve(conn)
	testkit.Eventually(t, 5*time.Second, func() error {
		if !pool.Has("dev") {
			return errors.New("no session yet")
		}
		return nil
	})
	return pool
}

// TestV2PathAndHost: the relay puts the announced path before the
// request's and sends the announced Host.
func TestV2PathAndHost(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Host+" "+r.URL.EscapedPath())
	}))
	defer backend.Close()
	addr := strings.TrimPrefix(backend.URL, "http://")
	pool := v2Session(t, addr, service.Service{Name: service.Default, Kind: service.HTTP, Addr: addr, Path: "/base"})
	req, _ := http.NewRequest(http.MethodGet, "http://dev/a%2Fb/c", nil)
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := addr + " /base/a%2Fb/c"; string(body) != want {
		t.Fatalf("backend saw %q, want %q", body, want)
	}
}

// TestV2UpgradeHalfClose: a 101 upgrade over a stream carries bytes both
// ways, and the user's half-close reaches the backend, which still answers.
func TestV2UpgradeHalfClose(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		got, _ := io.ReadAll(br) // until the user's half-close
		io.WriteString(c, "got "+string(got))
	}()
	addr := lis.Addr().String()
	pool := v2Session(t, addr, service.Service{Name: service.Default, Kind: service.HTTP, Addr: addr})
	req, _ := http.NewRequest(http.MethodGet, "http://dev/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %s", resp.Status)
	}
	rw := resp.Body.(io.ReadWriteCloser)
	defer rw.Close()
	io.WriteString(rw, "ping")
	if err := rw.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatalf("half-close: %v", err)
	}
	got, _ := io.ReadAll(rw)
	if string(got) != "got ping" {
		t.Fatalf("read %q", got)
	}
}

// TestV2ServiceErrors: a stream the agent resets because it cannot reach
// its service comes back as a *ServiceError (502), and an agent that
// announced no HTTP service gets ErrNoHTTPService.
func TestV2ServiceErrors(t *testing.T) {
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := lis.Addr().String()
	lis.Close() // nothing listens there: the agent's dial is refused
	pool := v2Session(t, closed, service.Service{Name: service.Default, Kind: service.HTTP, Addr: closed})
	req, _ := http.NewRequest(http.MethodGet, "http://dev/", nil)
	_, err := pool.RoundTrip(req)
	var se *ServiceError
	if !errors.As(err, &se) || se.Code != CodeServiceRefused || se.HTTPStatus() != http.StatusBadGateway {
		t.Fatalf("got %v, want a refused *ServiceError", err)
	}

	// An agent that does not know the name: it has lost its service.
	pool = v2SessionDial(t, func(conn net.Conn) {
		serveAgent(t, conn, func(context.Context, string) (net.Conn, error) { return nil, service.ErrUnknown })
	}, service.Service{Name: service.Default, Kind: service.HTTP, Addr: closed})
	_, err = pool.RoundTrip(req)
	if !errors.As(err, &se) || se.Code != CodeUnknownService {
		t.Fatalf("got %v, want an unknown-service *ServiceError", err)
	}

	pool = v2Session(t, closed, service.Service{Name: "ssh", Kind: service.TCP, Addr: closed})
	if _, err := pool.RoundTrip(req); !errors.Is(err, ErrNoHTTPService) {
		t.Fatalf("got %v, want ErrNoHTTPService", err)
	}
}

// TestV2DeviceCap: version 2 has no cap per agent, but a device's
// requests in flight stop at the pool's MaxDeviceStreams, beyond which the
// device answers a *BusyError (503) at once.
func TestV2DeviceCap(t *testing.T) {
	release := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-release
	}))
	defer backend.Close()
	defer close(release)
	addr := strings.TrimPrefix(backend.URL, "http://")
	pool := v2Session(t, addr, service.Service{Name: service.Default, Kind: service.HTTP, Addr: addr})
	pool.MaxDeviceStreams = DefaultMaxStreams + 1 // over version 1's cap per agent
	var bodies []io.Closer
	defer func() {
		for _, b := range bodies {
			b.Close()
		}
	}()
	for range pool.MaxDeviceStreams {
		req, _ := http.NewRequest(http.MethodGet, "http://dev/", nil)
		resp, err := pool.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, resp.Body)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://dev/", nil)
	_, err := pool.RoundTrip(req)
	var be *BusyError
	if !errors.As(err, &be) || be.DeviceCap != pool.MaxDeviceStreams || be.HTTPStatus() != http.StatusServiceUnavailable {
		t.Fatalf("request over the device's limit: %v, want a *BusyError", err)
	}
	if !strings.Contains(be.Error(), "257 requests in flight") {
		t.Fatalf("message %q", be.Error())
	}
}

// closeRecorder records that the agent closed its connection to the
// service, not just half-closed it.
type closeRecorder struct {
	*net.TCPConn
	closed chan struct{}
	once   sync.Once
}

func (c *closeRecorder) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.TCPConn.Close()
}

// TestV2CancelClosesService: a user who goes away makes the agent close
// its connection to the service at once, even one that stays silent and
// ignores the half-close.
func TestV2CancelClosesService(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	got := make(chan struct{})
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		http.ReadRequest(bufio.NewReader(c))
		close(got)
		io.Copy(io.Discard, c) // silent: never answers, ignores EOF
		<-t.Context().Done()
	}()
	addr := lis.Addr().String()
	rec := &closeRecorder{closed: make(chan struct{})}
	pool := v2SessionDial(t, func(conn net.Conn) {
		serveAgent(t, conn, func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			rec.TCPConn = c.(*net.TCPConn)
			return rec, nil
		})
	}, service.Service{Name: service.Default, Kind: service.HTTP, Addr: addr})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://dev/", nil)
	errc := make(chan error, 1)
	go func() {
		_, err := pool.RoundTrip(req)
		errc <- err
	}()
	<-got
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("round trip: %v, want context.Canceled", err)
	}
	select {
	case <-rec.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the agent kept its connection to the service after the user went away")
	}
}
