package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/datagram"
	"github.com/switchboard-relay/switchboard/internal/flows"
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

// TestOpenServiceByKind: a UDP stream reaches the agent's udp service, one
// datagram for one, through a socket of the stream's own; a name is found
// only under the kind it was announced with; passthrough opens only the
// tcp services announced for it.
func TestOpenServiceByKind(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte("echo: "), buf[:n]...), addr)
		}
	}()
	echo := testkit.ServeTCP(t, func(c net.Conn) { io.Copy(c, c) })
	pool := v2SessionDial(t, func(conn net.Conn) {
		serveAgent(t, conn, func(ctx context.Context, name string) (net.Conn, error) {
			var d net.Dialer
			switch name {
			case "voice":
				c, err := d.DialContext(ctx, "udp", pc.LocalAddr().String())
				if err != nil {
					return nil, err
				}
				return &flows.Socket{Conn: c}, nil
			case "web", "ssh":
				return d.DialContext(ctx, "tcp", echo)
			}
			return nil, service.ErrUnknown
		})
	},
		service.Service{Name: "voice", Kind: service.UDP, Addr: "127.0.0.1:1"},
		service.Service{Name: "web", Kind: service.TCP, Addr: "127.0.0.1:1", Passthrough: true},
		service.Service{Name: "ssh", Kind: service.TCP, Addr: "127.0.0.1:1"},
	)
	ctx := context.Background()
	conn, err := pool.OpenService(ctx, "dev", "voice", service.UDP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w, r := datagram.NewWriter(conn), datagram.NewReader(conn)
	buf := make([]byte, 2048)
	for _, msg := range []string{"one", "", "three"} {
		w.Write([]byte(msg))
		n, err := r.Read(buf)
		if err != nil || string(buf[:n]) != "echo: "+msg {
			t.Fatalf("%q: %q, %v", msg, buf[:n], err)
		}
	}

	for _, tc := range []struct {
		name string
		kind service.Kind
	}{{"voice", service.TCP}, {"ssh", service.UDP}, {"ssh", service.HTTP}} {
		if _, err := pool.OpenService(ctx, "dev", tc.name, tc.kind); !errors.Is(err, ErrUnknownService) {
			t.Errorf("%s as %s: %v, want ErrUnknownService", tc.name, tc.kind, err)
		}
	}
	if _, err := pool.OpenPassthrough(ctx, "dev", "ssh"); !errors.Is(err, ErrUnknownService) {
		t.Errorf("passthrough to a service not offered for it: %v, want ErrUnknownService", err)
	}
	pt, err := pool.OpenPassthrough(ctx, "dev", "web")
	if err != nil {
		t.Fatal(err)
	}
	defer pt.Close()
	pt.Write([]byte("hi"))
	if _, err := io.ReadFull(pt, buf[:2]); err != nil || string(buf[:2]) != "hi" {
		t.Fatalf("passthrough: %q, %v", buf[:2], err)
	}
}

// TestServiceBreakResetsTheStream: a service that breaks its connection
// (a TCP reset) resets the relay's stream, so that the relay tells its
// user the connection broke; one that ends it (FIN) ends the stream's
// reading as EOF, its writing still open.
func TestServiceBreakResetsTheStream(t *testing.T) {
	broken := testkit.ServeTCP(t, func(c net.Conn) {
		io.ReadFull(c, make([]byte, 1))
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	halfClosed := testkit.ServeTCP(t, func(c net.Conn) {
		c.Write([]byte("bye"))
		c.(*net.TCPConn).CloseWrite()
		io.ReadAll(c) // until the user's side ends too
	})
	pool := v2SessionDial(t, func(conn net.Conn) {
		serveAgent(t, conn, func(ctx context.Context, name string) (net.Conn, error) {
			var d net.Dialer
			if name == "broken" {
				return d.DialContext(ctx, "tcp", broken)
			}
			return d.DialContext(ctx, "tcp", halfClosed)
		})
	},
		service.Service{Name: "broken", Kind: service.TCP, Addr: "127.0.0.1:1"},
		service.Service{Name: "half", Kind: service.TCP, Addr: "127.0.0.1:1"},
	)
	ctx := context.Background()
	conn, err := pool.OpenService(ctx, "dev", "broken", service.TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("x"))
	if got, err := io.ReadAll(conn); err == nil {
		t.Fatalf("a service that reset its connection: read %q and EOF, want an error", got)
	}

	conn, err = pool.OpenService(ctx, "dev", "half", service.TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("x"))
	if got, err := io.ReadAll(conn); err != nil || string(got) != "bye" {
		t.Fatalf("a service that half-closed: %q, %v; want bye and EOF", got, err)
	}
	if _, err := conn.Write([]byte("more")); err != nil {
		t.Fatalf("writing after the service's half-close: %v", err)
	}
}
