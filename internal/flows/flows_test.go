package flows

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/datagram"
	"github.com/switchboard-relay/switchboard/internal/lograte"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// udpEcho serves a UDP echo on host until the test ends, answering each
// datagram upper-cased, and "oversized" with a datagram over the limit.
func udpEcho(t *testing.T, host string) string {
	pc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Skipf("no UDP on %s: %v", host, err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	go func() {
		defer close(done)
		buf := make([]byte, 70000)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if string(buf[:n]) == "oversized" {
				pc.WriteTo(make([]byte, datagram.MaxSize+1), addr)
				continue
			}
			pc.WriteTo(bytes.ToUpper(buf[:n]), addr)
		}
	}()
	return pc.LocalAddr().String()
}

// fixture is a Server on host whose flows each reach the echo through a
// pipe joined to a socket of its own, as a relay's flows reach a device's
// agent.
type fixture struct {
	srv    *Server
	addr   string
	opens  chan netip.AddrPort
	logs   *testkit.Buffer
	joined chan error // why each Join ended
}

func start(t *testing.T, host string, cfg Config) *fixture {
	echo := udpEcho(t, host)
	pc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{addr: pc.LocalAddr().String(), opens: make(chan netip.AddrPort, 16), logs: &testkit.Buffer{}, joined: make(chan error, 16)}
	cfg.Logger = slog.New(slog.NewTextHandler(f.logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	f.srv = &Server{Conn: pc, Config: cfg, Open: func(ctx context.Context, src netip.AddrPort) (net.Conn, error) {
		select {
		case f.opens <- src:
		case <-ctx.Done(): // more flows than opens holds: the test has failed
			return nil, ctx.Err()
		}
		relaySide, agentSide := net.Pipe()
		svc, err := net.Dial("udp", echo)
		if err != nil {
			return nil, err
		}
		wg.Go(func() { f.joined <- Join(ctx, agentSide, svc, cfg) })
		return relaySide, nil
	}}
	wg.Go(func() { f.srv.Serve(ctx) })
	t.Cleanup(func() {
		cancel()
		pc.Close()
		wg.Wait()
	})
	return f
}

func exchange(c net.Conn, msg []byte) (string, error) {
	if _, err := c.Write(msg); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 70000)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// TestFlows: each source is one flow, datagrams keep their boundaries both
// ways, and a flow idle past its time ends; the next datagram starts
// another.
func TestFlows(t *testing.T) {
	f := start(t, "127.0.0.1", Config{Idle: 300 * time.Millisecond})
	var clients []net.Conn
	for range 2 {
		c, err := net.Dial("udp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	for i, c := range clients {
		for _, msg := range []string{"one", strings.Repeat("x", 1400), "", fmt.Sprint("three ", i)} {
			got, err := exchange(c, []byte(msg))
			if err != nil || got != strings.ToUpper(msg) {
				t.Fatalf("client %d, %.10q: %.10q, %v", i, msg, got, err)
			}
		}
	}
	if n := len(f.opens); n != 2 {
		t.Fatalf("%d streams for two sources", n)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := f.srv.Flows(); n != 0 {
			return fmt.Errorf("%d flows open past their idle time", n)
		}
		return nil
	})
	for range 2 {
		if err := <-f.joined; !errors.Is(err, ErrIdle) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
			t.Errorf("the agent's side ended with %v", err)
		}
	}
	if got, err := exchange(clients[0], []byte("again")); err != nil || got != "AGAIN" {
		t.Fatalf("after idle: %q, %v", got, err)
	}
	if n := len(f.opens); n != 3 {
		t.Fatalf("%d streams after the idle flows ended, want 3", n)
	}
}

// TestLinesBounded: sources a sender makes up start flows as fast as it
// sends, but their lines stay within Lines' bound; every flow is carried.
func TestLinesBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	f := start(t, "127.0.0.1", Config{Lines: lograte.New(3).WithClock(func() time.Time { return now })})
	const sources = 12 // within the fixture's opens
	for i := range sources {
		c, err := net.Dial("udp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got, err := exchange(c, []byte("hi")); err != nil || got != "HI" {
			t.Fatalf("source %d: %q, %v", i, got, err)
		}
	}
	if n := len(f.opens); n != sources {
		t.Fatalf("%d flows opened for %d sources", n, sources)
	}
	if n := f.logs.Count("msg="); n != 3 {
		t.Fatalf("%d lines in one second, want 3:\n%s", n, f.logs)
	}
}

// TestOversizedDatagram: a datagram over datagram.MaxSize (IPv6 carries
// them) is dropped with a warning where it is read, on the user's side and
// on the service's, and the flow goes on.
func TestOversizedDatagram(t *testing.T) {
	f := start(t, "::1", Config{})
	c, err := net.Dial("udp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := make([]byte, datagram.MaxSize+13)
	if _, err := c.Write(big); err != nil {
		t.Skipf("this host sends no UDP datagram of %d bytes over IPv6: %v", len(big), err)
	}
	if got, err := exchange(c, []byte("small")); err != nil || got != "SMALL" {
		t.Fatalf("after an oversized datagram: %q, %v", got, err)
	}
	want := fmt.Sprintf("datagram dropped: over the %d bytes a flow carries", datagram.MaxSize)
	if !strings.Contains(f.logs.String(), want) {
		t.Fatalf("no warning %q in the logs:\n%s", want, f.logs)
	}
	// The service's side: a service answering over the limit.
	if _, err := c.Write([]byte("oversized")); err != nil {
		t.Fatal(err)
	}
	if got, err := exchange(c, []byte("next")); err != nil || got != "NEXT" {
		t.Fatalf("after the service's oversized datagram: %.10q (%d bytes), %v", got, len(got), err)
	}
	if n := f.logs.Count(want); n != 2 {
		t.Fatalf("%d warnings %q, want one on each side:\n%s", n, want, f.logs)
	}
}

// TestJoinRefusesAnOversizedFrame: a stream whose frame claims more than
// datagram.MaxSize bytes ends the flow with datagram.ErrTooLarge.
func TestJoinRefusesAnOversizedFrame(t *testing.T) {
	echo := udpEcho(t, "127.0.0.1")
	svc, err := net.Dial("udp", echo)
	if err != nil {
		t.Fatal(err)
	}
	relaySide, agentSide := net.Pipe()
	defer relaySide.Close()
	go relaySide.Write([]byte{0xff, 0xff, 1, 2, 3})
	if err := Join(context.Background(), agentSide, svc, Config{}); !errors.Is(err, datagram.ErrTooLarge) {
		t.Fatalf("Join: %v, want datagram.ErrTooLarge", err)
	}
}

// TestQueueBound: a flow whose stream takes nothing holds Queue datagrams
// and drops the rest, and says so when it ends.
func TestQueueBound(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.Buffer{}
	stuck, peer := net.Pipe() // nobody reads peer: writes to stuck block
	defer peer.Close()
	srv := &Server{Conn: pc, Config: Config{Queue: 4, Logger: slog.New(slog.NewTextHandler(logs, nil))},
		Open: func(context.Context, netip.AddrPort) (net.Conn, error) { return stuck, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ctx)
	}()
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 20 {
		c.Write([]byte("x"))
	}
	// 20 sent: one in the blocked write, 4 queued, 15 dropped (fewer if
	// the socket dropped some first).
	testkit.Eventually(t, 5*time.Second, func() error {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		for _, f := range srv.flows {
			if n := f.dropped.Load(); n >= 10 {
				return nil
			}
		}
		return errors.New("too few datagrams dropped")
	})
	cancel()
	pc.Close()
	<-done
	if !strings.Contains(logs.String(), "flow ended") || strings.Contains(logs.String(), "dropped=0 ") {
		t.Fatalf("the flow's end tells no drops:\n%s", logs)
	}
}
