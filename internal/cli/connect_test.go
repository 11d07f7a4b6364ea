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
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// echoOpener reaches one echo service, robot/echo, over real TCP.
type echoOpener struct{ addr string }

func (o echoOpener) Open(ctx context.Context, t connect.Target) (net.Conn, error) {
	if t != (connect.Target{Device: "robot", Service: "echo"}) {
		return nil, connect.ErrUnknownService
	}
	return net.Dial("tcp", o.addr)
}

func connectRelay(t *testing.T) string {
	echoAddr := testkit.ServeTCP(t, func(c net.Conn) { io.Copy(c, c) })
	h := &connect.Handler{Open: echoOpener{echoAddr}, Authorize: func(r *http.Request) (connect.Allow, error) {
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

func TestConnectUsage(t *testing.T) {
	for _, args := range [][]string{
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
