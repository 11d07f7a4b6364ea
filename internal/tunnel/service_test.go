package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestOpenService: a stream reaches a TCP service the agent announced;
// a device with no version 2 agent, a name not announced as TCP, and an
// agent's refusal each come back as what they are.
func TestOpenService(t *testing.T) {
	echo := testkit.ServeTCP(t, func(c net.Conn) { io.Copy(c, c) })
	pool := v2SessionDial(t, func(conn net.Conn) {
		serveAgent(t, conn, func(ctx context.Context, name string) (net.Conn, error) {
			switch name {
			case "echo":
				var d net.Dialer
				return d.DialContext(ctx, "tcp", echo)
			case "down":
				return nil, syscall.ECONNREFUSED
			}
			return nil, service.ErrUnknown
		})
	},
		service.Service{Name: service.Default, Kind: service.HTTP, Addr: "127.0.0.1:1"},
		service.Service{Name: "echo", Kind: service.TCP, Addr: "127.0.0.1:1"},
		service.Service{Name: "down", Kind: service.TCP, Addr: "127.0.0.1:1"},
	)
	ctx := context.Background()
	conn, err := pool.OpenService(ctx, "dev", "echo", service.TCP)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("hi"))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	conn.Close()

	if _, err := pool.OpenService(ctx, "ghost", "echo", service.TCP); !errors.Is(err, ErrNoAgent) {
		t.Errorf("no agent: %v, want ErrNoAgent", err)
	}
	for _, name := range []string{"nope", service.Default} { // not announced; announced as HTTP
		if _, err := pool.OpenService(ctx, "dev", name, service.TCP); !errors.Is(err, ErrUnknownService) {
			t.Errorf("%s: %v, want ErrUnknownService", name, err)
		}
	}
	conn, err = pool.OpenService(ctx, "dev", "down", service.TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("x"))
	_, err = conn.Read(buf)
	var se *ServiceError
	if !errors.As(err, &se) || se.Code != CodeServiceRefused || se.Service != "down" {
		t.Fatalf("refused dial: %v, want a ServiceError with CodeServiceRefused", err)
	}
}
