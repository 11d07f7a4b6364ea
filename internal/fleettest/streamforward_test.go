package fleettest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// streamFleet starts two relays (opts applied to the i-th as opts(i, c))
// and a backend, and an agent of proto for a device held by the relay
// holder says, found among dev-0, dev-1, ... It returns the relay that
// does not hold the device, the holder, the device and a user token.
func streamFleet(t *testing.T, proto string, opts func(i int, c *node.Config), holder func(relays []*Relay) *Relay) (entry, held *Relay, device, user string) {
	t.Helper()
	i := 0
	relays := StartFleet(t, 2, func(c *node.Config) {
		c.DrainSpread = 200 * time.Millisecond
		if opts != nil {
			opts(i, c)
		}
		i++
	})
	want := holder(relays)
	for n := 0; n < 100; n++ {
		d := fmt.Sprintf("dev-%d", n)
		if h, _ := HolderFor(t, relays, d); h == want {
			device = d
			break
		}
	}
	if device == "" {
		t.Fatal("no device name the wanted relay holds")
	}
	b := newBackend(t, "b1")
	StartAgent(t, want, device, b.URL, FleetToken(t, relays, auth.KindAgent, "", device), protocol(proto), knowsAll(t, relays))
	waitHolder(t, relays, device, want)
	for _, r := range relays {
		if r != want {
			entry = r
		}
	}
	return entry, want, device, FleetToken(t, relays, auth.KindUser, "u", device)
}

func first(relays []*Relay) *Relay { return relays[0] }

// TestStreamForwardToVersion2Agent: requests through a relay that does not
// hold their device, whose agent speaks tunnel version 2, go as streams
// spliced onto the agent's tunnel, one pooled stream for requests one
// after another, none over HTTP.
func TestStreamForwardToVersion2Agent(t *testing.T) {
	entry, _, device, user := streamFleet(t, agent.ProtocolNative, nil, first)
	for i := range 3 {
		e := decodeEcho(t, do(t, http.MethodGet, fmt.Sprintf("%s/client/%s/echo/%d", entry.URL, device, i), user, nil))
		if e.Path != fmt.Sprintf("/echo/%d", i) || e.Header.Get("Authorization") != "" {
			t.Errorf("request %d: %+v", i, e)
		}
	}
	if streams, overHTTP := entry.Node.StreamForwards(); streams != 1 || overHTTP != 0 {
		t.Errorf("%d streams and %d requests over HTTP for three requests one after another; want 1 and 0", streams, overHTTP)
	}
}

// TestStreamForwardFallsBackToHTTP: a forward goes over HTTP, and is
// answered, when the holder's agent is version 1 or long-poll, when the
// holder is a relay from before stream forwards (a roll), and when the
// forwarding relay is one.
func TestStreamForwardFallsBackToHTTP(t *testing.T) {
	second := func(relays []*Relay) *Relay { return relays[1] }
	older := func(n int) func(i int, c *node.Config) {
		return func(i int, c *node.Config) { c.NoStreamForward = i == n }
	}
	for _, c := range []struct {
		name     string
		proto    string
		opts     func(int, *node.Config)
		holder   func([]*Relay) *Relay
		overHTTP bool // the forwarding relay asked for a stream and was refused
	}{
		{"version 1 agent", protocolNativeV1, nil, first, true},
		{"long-poll agent", agent.ProtocolLongPoll, nil, first, true},
		{"older holder", agent.ProtocolNative, older(0), first, true},
		{"older forwarding relay", agent.ProtocolNative, older(0), second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			entry, _, device, user := streamFleet(t, c.proto, c.opts, c.holder)
			for range 2 {
				e := decodeEcho(t, do(t, http.MethodPost, entry.URL+"/client/"+device+"/echo/x", user, strings.NewReader("whole")))
				if e.Body != "whole" || e.Path != "/echo/x" {
					t.Errorf("echo %+v", e)
				}
			}
			_, overHTTP := entry.Node.StreamForwards()
			if (overHTTP > 0) != c.overHTTP {
				t.Errorf("%d requests went over HTTP after the holder refused a stream; want some: %v", overHTTP, c.overHTTP)
			}
		})
	}
}

// TestStreamForwardLetsTheHolderDrain: a relay that forwarded a request
// as a stream keeps it pooled; when the holder stops, its agent's session
// drains, the holder asks the forwarding relay to retire the stream, and
// the session ends at once rather than when the pooled stream would have
// timed out (30 s): the holder stops well within its deadline, the agent
// moves, and requests follow it.
func TestStreamForwardLetsTheHolderDrain(t *testing.T) {
	entry, held, device, user := streamFleet(t, agent.ProtocolNative, nil, first)
	decodeEcho(t, do(t, http.MethodGet, entry.URL+"/client/"+device+"/echo/x", user, nil))
	if streams, _ := entry.Node.StreamForwards(); streams != 1 {
		t.Fatalf("%d streams, want the one pooled", streams)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	start := time.Now()
	if err := held.Node.Shutdown(ctx); err != nil {
		t.Fatalf("the holder's shutdown: %v after %s, want nil well before its deadline", err, time.Since(start))
	}
	t.Logf("the holder stopped in %s", time.Since(start).Round(time.Millisecond))
	entry.WaitDevice(t, device)
	if e := decodeEcho(t, do(t, http.MethodGet, entry.URL+"/client/"+device+"/echo/y", user, nil)); e.Path != "/echo/y" {
		t.Errorf("after the move: %+v", e)
	}
}
