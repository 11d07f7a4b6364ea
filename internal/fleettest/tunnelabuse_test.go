package fleettest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// h2Frame encodes an HTTP/2 frame header with the given length, type,
// flags and stream, followed by payload.
func h2Frame(length uint32, typ, flags byte, stream uint32, payload []byte) []byte {
	b := make([]byte, 9, 9+len(payload))
	b[0], b[1], b[2] = byte(length>>16), byte(length>>8), byte(length)
	b[3], b[4] = typ, flags
	binary.BigEndian.PutUint32(b[5:], stream)
	return append(b, payload...)
}

// TestMalformedTunnels opens native tunnels that then misbehave: after a
// good handshake the "agent" sends what no HTTP/2 server would. Each time
// the relay drops the tunnel, lists no agent for the device, logs no panic,
// and goes on serving a good agent's device.
func TestMalformedTunnels(t *testing.T) {
	watch := &panicWatch{}
	r := StartRelay(t, func(c *node.Config) { c.Logger = slog.New(watch) })
	b := newBackend(t, "good")
	StartAgent(t, r, "good", b.URL, r.Token(t, auth.KindAgent, "good agent", "good"))
	r.WaitDevice(t, "good")
	user := r.Token(t, auth.KindUser, "alice")
	agentTok := r.Token(t, auth.KindAgent, "bad agent", "bad")
	base := mustParse(t, r.URL)

	settings := h2Frame(0, 0x4, 0, 0, nil)
	cases := []struct {
		name  string
		bytes []byte // written after the handshake; nil: close at once
	}{
		{"closed right after the handshake", nil},
		{"text instead of HTTP/2", []byte("HTTP/1.1 200 OK\r\n\r\nhello")},
		{"a frame of 16 MiB announced", append(settings, h2Frame(1<<24-1, 0x0, 0, 1, []byte("x"))...)},
		{"SETTINGS on a stream", h2Frame(0, 0x4, 0, 7, nil)},
		{"SETTINGS of a length not a multiple of 6", h2Frame(5, 0x4, 0, 0, []byte{0, 1, 0, 0, 0})},
		{"a WINDOW_UPDATE of 0", append(settings, h2Frame(4, 0x8, 0, 0, []byte{0, 0, 0, 0})...)},
		{"GOAWAY of garbage", append(settings, h2Frame(3, 0x7, 0, 0, []byte{1, 2, 3})...)},
		{"random bytes", []byte(strings.Repeat("\xff\x00\x13\x37", 4096))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := tunnel.Dial(ctx, tunnel.DialConfig{Relay: base, Device: "bad", Token: agentTok}, http.Header{})
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			defer conn.Close()
			if c.bytes == nil {
				conn.Close()
			} else {
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				conn.Write(c.bytes)
				// The relay hangs up: reading ends (it may send its preface
				// and a GOAWAY first).
				if _, err := io.Copy(io.Discard, conn); err != nil && !isClosedOrReset(err) {
					t.Errorf("the relay kept the tunnel open: %v", err)
				}
			}
			Eventually(t, 5*time.Second, func() error {
				if slices.Contains(r.Node.Devices(), "bad") {
					return fmt.Errorf("the relay lists an agent for the device")
				}
				if n := r.Node.TunnelSessions(); n != 1 {
					return fmt.Errorf("%d tunnels, want the good one only", n)
				}
				return nil
			})
			if status, body, _ := get(t, r.URL+"/client/good/echo/after", "Authorization", "Bearer "+user); status != http.StatusOK {
				t.Errorf("the good device afterwards: %d %s", status, body)
			}
			if p := watch.take(); len(p) > 0 {
				t.Errorf("panics logged: %q", p)
			}
		})
	}
}

// isClosedOrReset reports whether err is how a peer's hang-up shows.
func isClosedOrReset(err error) bool {
	var ne net.Error
	if strings.Contains(err.Error(), "reset by peer") || strings.Contains(err.Error(), "use of closed") {
		return true
	}
	return !(errors.As(err, &ne) && ne.Timeout())
}
