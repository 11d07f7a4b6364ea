package node

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"
)

// TestPassthroughAnswerBounded: a service that takes the hello and never
// answers holds the user's connection for the listener's bound on the
// answer, then the user's TLS client is told the service could not be
// reached, and the passthrough is refused as unreachable.
func TestPassthroughAnswerBounded(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opened := make(chan net.Conn, 1)
	open := func(ctx context.Context, target connect.Target) (net.Conn, error) {
		relaySide, serviceSide := net.Pipe()
		go func() { // the service reads the hello and says nothing
			buf := make([]byte, 64<<10)
			for {
				if _, err := serviceSide.Read(buf); err != nil {
					return
				}
			}
		}()
		opened <- serviceSide
		return relaySide, nil
	}
	conns := tcpconns.New(tcpconns.Config{})
	l := newSNIListener(inner, "example.test", 5*time.Second, open, conns, slog.New(slog.DiscardHandler))
	l.answer = 200 * time.Millisecond
	defer l.closeAll()
	defer func() {
		select {
		case c := <-opened:
			c.Close()
		default:
		}
	}()

	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	err = tls.Client(c, &tls.Config{ServerName: "ssh--robot.example.test", InsecureSkipVerify: true}).Handshake()
	if err == nil || !strings.Contains(err.Error(), "internal error") {
		t.Fatalf("handshake with a service that never answers: %v, want the relay's internal_error alert", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the alert came after %v", d)
	}
}
