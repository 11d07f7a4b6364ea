package tunnel

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestSuggestStandbyOnlyToAgentsThatKnowIt: a relay names a standby, on
// a stream of its own, to the version 2 agents that announced their ping
// interval (agents that know hot standby), and to no agent from before,
// which would take the stream for a service.
func TestSuggestStandbyOnlyToAgentsThatKnowIt(t *testing.T) {
	ann := announce(t, service.Service{Name: service.Default, Kind: service.HTTP, Addr: "127.0.0.1:1"})
	r := RelayAddr{ID: "rl-0011aabb", URL: "https://relay-2.example:8443"}
	for _, paced := range []bool{true, false} {
		pool, u := relayV2(t, false)
		var header http.Header
		if paced {
			header = http.Header{PingHeader: {"10000"}}
		}
		conn, err := Dial(context.Background(), DialConfig{Relay: u, Device: "dev", Version: V2, Services: ann}, header)
		if err != nil {
			t.Fatal(err)
		}
		metas := make(chan string, 4)
		serveAgent(t, conn, func(_ context.Context, name string) (net.Conn, error) {
			metas <- name
			return nil, service.ErrUnknown
		})
		testkit.Eventually(t, 5*time.Second, func() error {
			if !pool.Has("dev") {
				return errors.New("no session yet")
			}
			return nil
		})
		if bad := pool.SuggestStandby("dev", RelayAddr{ID: "rl 1", URL: r.URL}); bad != 0 {
			t.Fatalf("a relay id with a space was suggested to %d agents", bad)
		}
		n := pool.SuggestStandby("dev", r)
		if !paced {
			if n != 0 {
				t.Fatalf("an agent from before hot standby was named a standby (%d)", n)
			}
			select {
			case m := <-metas:
				t.Fatalf("the agent got a stream %q", m)
			default:
			}
			continue
		}
		if n != 1 {
			t.Fatalf("SuggestStandby told %d agents, want 1", n)
		}
		select {
		case m := <-metas:
			got, ok := Suggested(m)
			if !ok || got != r {
				t.Fatalf("the agent got %q, which suggests %+v, %v; want %+v", m, got, ok, r)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the agent got no suggestion")
		}
		if n := pool.SuggestStandby("absent", r); n != 0 {
			t.Fatalf("a device without tunnels was told %d times", n)
		}
	}
}
