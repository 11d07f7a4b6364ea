package cli

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/flows"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// echoOpener reaches one echo service, robot/echo, over real TCP, and
// robot/voice, a UDP echo, as a device's agent does (one socket a flow).
type echoOpener struct{ addr, udp string }

func (o echoOpener) Open(ctx context.Context, t connect.Target) (net.Conn, error) {
	switch t {
	case connect.Target{Device: "robot", Service: "echo", Network: connect.TCP}:
		return net.Dial("tcp", o.addr)
	case connect.Target{Device: "robot", Service: "voice", Network: connect.UDP}:
		svc, err := net.Dial("udp", o.udp)
		if err != nil {
			return nil, err
		}
		relaySide, agentSide := net.Pipe()
		go flows.Join(context.Background(), agentSide, svc, flows.Config{})
		return relaySide, nil
	}
	return nil, connect.ErrUnknownService
}

// udpEcho serves a UDP echo, upper-casing, until the test ends.
func udpEcho(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(strings.ToUpper(string(buf[:n]))), addr)
		}
	}()
	return pc.LocalAddr().String()
}

func connectRelay(t *testing.T) string {
	echoAddr := testkit.ServeTCP(t, func(c net.Conn) { io.Copy(c, c) })
	h := &connect.Handler{Open: echoOpener{echoAddr, udpEcho(t)}, Authorize: func(r *http.Request) (connect.Allow, error) {
		if r.Header.Get("Authorization") != "Bearer sbu_good" {
			return nil, &connect.StatusError{Code: http.StatusUnauthorized, Msg: "no valid token"}
		}
		return func(connect.Target) error { return nil }, nil
	}}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv.URL
}

func TestConnectStdio(t *testing.T) {
	relay := connectRelay(t)
	var out, errs strings.Builder
	err := runConnect(context.Background(), []string{"--relay", relay, "--token", "sbu_good", "robot/echo"}, strings.NewReader("over stdin"), &out, &errs)
	if err != nil || out.String() != "over stdin" {
		t.Fatalf("stdout %q, err %v, stderr %s", out.String(), err, errs.String())
	}
	err = runConnect(context.Background(), []string{"--relay", relay, "--token", "sbu_good", "robot/nope"}, strings.NewReader("x"), &out, &errs)
	if !errors.Is(err, connect.ErrUnknownService) {
		t.Fatalf("an unknown service: %v", err)
	}
	err = runConnect(context.Background(), []string{"--relay", relay, "--token", "sbu_bad", "robot/echo"}, strings.NewReader("x"), &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a bad token: %v", err)
	}
}

func TestConnectListen(t *testing.T) {
	relay := connectRelay(t)
	ctx, cancel := context.WithCancel(context.Background())
	var errs testkit.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runConnect(ctx, []string{"--relay", relay, "--token", "sbu_good", "--listen", "127.0.0.1:0", "robot/echo"}, strings.NewReader(""), io.Discard, &errs)
	}()
	var addr string
	testkit.Eventually(t, 5*time.Second, func() error {
		m := regexp.MustCompile(`listens on (\S+)`).FindStringSubmatch(errs.String())
		if m == nil {
			return errors.New("not listening yet")
		}
		addr = m[1]
		return nil
	})
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("ping"))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("through the listener: %q, %v", buf, err)
		}
		c.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestConnectUDP: connect --udp --listen carries each local source's
// datagrams as one flow to a udp service and back.
func TestConnectUDP(t *testing.T) {
	relay := connectRelay(t)
	ctx, cancel := context.WithCancel(context.Background())
	var errs testkit.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runConnect(ctx, []string{"--relay", relay, "--token", "sbu_good", "--udp", "--listen", "127.0.0.1:0", "robot/voice"}, strings.NewReader(""), io.Discard, &errs)
	}()
	var addr string
	testkit.Eventually(t, 5*time.Second, func() error {
		m := regexp.MustCompile(`listens on udp (\S+)`).FindStringSubmatch(errs.String())
		if m == nil {
			return errors.New("not listening yet")
		}
		addr = m[1]
		return nil
	})
	for i := range 2 {
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range []string{"ping", strings.Repeat("x", 3000), "pong"} {
			c.Write([]byte(msg))
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 4000)
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != strings.ToUpper(msg) {
				t.Fatalf("source %d, %.10q: %.10q, %v", i, msg, buf[:n], err)
			}
		}
		c.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestConnectUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--relay", "http://x", "--token", "t", "--udp", "robot/voice"}, // no --listen
		{"robot/echo"},
		{"--relay", "http://x", "robot"},
		{"--relay", "ftp://x", "--token", "t", "robot/echo"},
		{"--relay", "http://x", "--token", "t"},
	} {
		err := runConnect(context.Background(), args, strings.NewReader(""), io.Discard, io.Discard)
		if !errors.As(err, new(*UsageError)) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
