package fleettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// fleetSetup starts three relays on one NATS, a backend, and an agent for
// "dev" on the relay that should hold it, and waits until every relay's
// directory has it there. It returns the relays with the holder last, the
// backend and a user token.
func fleetSetup(t *testing.T, proto string) ([]*Relay, *testBackend, string) {
	t.Helper()
	relays := StartFleet(t, 3)
	holder, others := HolderFor(t, relays, "dev")
	b := newBackend(t, "b1")
	StartAgent(t, holder, "dev", b.URL, holder.Token(t, auth.KindAgent, "dev agent", "dev"), protocol(proto))
	waitHolder(t, relays, "dev", holder)
	return append(others, holder), b, FleetToken(t, relays, auth.KindUser, "alice", "dev")
}

// holderLast returns relays with the holder of device last.
func holderLast(t *testing.T, relays []*Relay, device string) []*Relay {
	holder, others := HolderFor(t, relays, device)
	return append(others, holder)
}

// waitHolder waits until every relay's directory puts device on holder.
func waitHolder(t *testing.T, relays []*Relay, device string, holder *Relay) {
	t.Helper()
	want := holder.Node.Fleet().ID()
	for _, r := range relays {
		Eventually(t, 10*time.Second, func() error {
			d, err := r.Node.Fleet().Device(device)
			if err != nil {
				return err
			}
			if d.RelayID != want || d.Agents == 0 {
				return errors.New("directory has " + d.RelayID)
			}
			return nil
		})
	}
}

func TestForwardThroughNonHolder(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		relays, b, user := fleetSetup(t, proto)
		for _, entry := range relays[:2] {
			e := decodeEcho(t, do(t, http.MethodPost, entry.URL+"/client/dev/echo/a%2Fb?q=1", user, strings.NewReader("payload")))
			if e.Backend != "b1" || e.Body != "payload" || e.Path != "/echo/a/b" || e.RawPath != "/echo/a%2Fb" || e.Query != "q=1" {
				t.Errorf("via %s: echo %+v", entry.URL, e)
			}
			if e.Header.Get("Authorization") != "" || e.Header.Get("X-Switchboard-Peer") != "" {
				t.Errorf("credentials reached the device: %v", e.Header)
			}
		}
		// Header addressing works through a forward too.
		e := decodeEcho(t, do(t, http.MethodGet, relays[1].URL+"/echo/h", user, nil, "X-Server-Name", "dev"))
		if e.Path != "/echo/h" {
			t.Errorf("header addressing: %+v", e)
		}

		// A streamed response arrives event by event.
		resp := do(t, http.MethodGet, relays[0].URL+"/client/dev/sse", user, nil)
		rd := bufio.NewReader(resp.Body)
		for i := 1; i <= 3; i++ {
			b.sseGo <- struct{}{}
			line, err := rd.ReadString('\n')
			if err != nil || line != "data: event "+string(rune('0'+i))+"\n" {
				t.Fatalf("event %d: %q, %v", i, line, err)
			}
			rd.ReadString('\n')
		}
		resp.Body.Close()

		// Trailers survive the extra hop.
		resp = do(t, http.MethodGet, relays[0].URL+"/client/dev/trailers", user, nil)
		io.ReadAll(resp.Body)
		if resp.Trailer.Get("X-Checksum") != "abc123" {
			t.Errorf("trailers %v", resp.Trailer)
		}

		// A websocket through the non-holder.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(relays[0].URL, "http")+"/client/dev/ws", &websocket.DialOptions{
			HTTPHeader: http.Header{"Authorization": {"Bearer " + user}},
		})
		if err != nil {
			t.Fatalf("websocket via a non-holder: %v", err)
		}
		defer c.CloseNow()
		for _, msg := range []string{"hello", strings.Repeat("x", 30000)} {
			if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			if _, got, err := c.Read(ctx); err != nil || string(got) != msg {
				t.Fatalf("echo: %d bytes, %v", len(got), err)
			}
		}
		c.Close(websocket.StatusNormalClosure, "")

		// Users are still checked at the entry.
		if code, _ := Status(NewClient(t, false), relays[0].URL+"/client/dev/echo/x"); code != http.StatusUnauthorized {
			t.Errorf("no token via a non-holder: %d, want 401", code)
		}

		// To a version 2 agent everything went as streams; to the others
		// over HTTP.
		streams, overHTTP := relays[0].Node.StreamForwards()
		if v2 := proto == agent.ProtocolNative; v2 && (streams == 0 || overHTTP != 0) || !v2 && overHTTP == 0 {
			t.Errorf("%d streams, %d requests over HTTP", streams, overHTTP)
		}
	})
}

func TestForwardedCancellationReachesTheBackend(t *testing.T) {
	relays := holderLast(t, StartFleet(t, 3), "dev")
	bb := &blockingBackend{release: make(chan struct{})}
	backend := httptestServer(t, bb)
	StartAgent(t, relays[2], "dev", backend, relays[2].Token(t, auth.KindAgent, "", "dev"))
	waitHolder(t, relays, "dev", relays[2])
	user := FleetToken(t, relays, auth.KindUser, "u", "dev")

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, relays[0].URL+"/client/dev/block", nil)
	req.Header.Set("Authorization", "Bearer "+user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	Eventually(t, 5*time.Second, func() error {
		if bb.started.Load() != 1 {
			return errNotYet
		}
		return nil
	})
	cancel()
	resp.Body.Close()
	Eventually(t, 5*time.Second, func() error {
		if bb.cancelled.Load() != 1 {
			return errors.New("the backend did not see the user go away")
		}
		return nil
	})
}

func TestForwardedGRPCBidi(t *testing.T) {
	relays := holderLast(t, StartFleet(t, 3), "grpc-dev")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	testpb.RegisterTestServiceServer(srv, streamingService{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	StartAgent(t, relays[2], "grpc-dev", "http://"+lis.Addr().String(), relays[2].Token(t, auth.KindAgent, "a", "grpc-dev"),
		protocol(agent.ProtocolNative), func(c *agent.Config) { c.BackendH2C = true })
	waitHolder(t, relays, "grpc-dev", relays[2])

	conn, err := grpc.NewClient(strings.TrimPrefix(relays[0].URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := testpb.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-server-name", "grpc-dev", "x-switchboard-token", FleetToken(t, relays, auth.KindUser, "u"))
	stream, err := client.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 50; i++ {
		if err := stream.Send(&testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{Size: int32(i)}}}); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
		resp, err := stream.Recv()
		if err != nil || len(resp.GetPayload().GetBody()) != i {
			t.Fatalf("pong %d: %v", i, err)
		}
	}
	stream.CloseSend()
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v", err)
	}
}

// TestRefusedHolderIsVetoedAtOnce: the relay recorded as the device's
// holder is gone but still fresh in the fleet state; the first forward to it
// is refused, which vetoes it at once, and the request goes to the ranking's
// next choice instead of failing with a 502.
func TestRefusedHolderIsVetoedAtOnce(t *testing.T) {
	relays := StartFleet(t, 3, func(c *node.Config) {
		c.Fleet.FreshAfter = time.Minute // the dead relay stays fresh
		c.Broker.NoAgentGrace = 200 * time.Millisecond
	})
	relays = holderLast(t, relays, "dev")
	user := FleetToken(t, relays, auth.KindUser, "u", "dev")
	b := newBackend(t, "b1")
	ag := StartAgent(t, relays[2], "dev", b.URL, relays[2].Token(t, auth.KindAgent, "", "dev"))
	waitHolder(t, relays, "dev", relays[2])
	// The agent goes; the device stays recorded on its relay, which then
	// dies: nothing but a refused connection tells the others.
	ag.Stop()
	Eventually(t, 5*time.Second, func() error {
		if d, err := relays[0].Node.Fleet().Device("dev"); err != nil || d.Agents != 0 {
			return errors.New("not detached yet")
		}
		return nil
	})
	dead := relays[2].Node.Fleet().ID()
	relays[2].Node.Fleet().Abandon()
	relays[2].Node.Close()

	resp := do(t, http.MethodGet, relays[0].URL+"/client/dev/echo/x", user, nil)
	io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503 (no agent anywhere), not a 502 from the dead holder", resp.StatusCode)
	}
	if !relays[0].Node.Vetoed(dead) {
		t.Error("the refused holder was not vetoed")
	}
	Eventually(t, 5*time.Second, func() error {
		evs, err := relays[1].Node.Fleet().Events(t.Context(), 100)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Type == node.EventRelayVetoed && e.RelayID == dead {
				return nil
			}
		}
		return errors.New("no veto event")
	})
}

// TestAgentRedirectedToHolder starts an agent against a relay that should
// not hold its device: it is sent to the one that should.
func TestAgentRedirectedToHolder(t *testing.T) {
	for _, ws := range []bool{false, true} {
		t.Run(map[bool]string{false: "upgrade", true: "websocket"}[ws], func(t *testing.T) {
			relays := StartFleet(t, 3)
			holder, others := HolderFor(t, relays, "dev")
			b := newBackend(t, "b1")
			tok := FleetToken(t, relays, auth.KindAgent, "", "dev")
			StartAgent(t, others[0], "dev", b.URL, tok, func(c *agent.Config) { c.WebSocket = ws })
			waitHolder(t, relays, "dev", holder)
			if n := others[0].Node.TunnelSessions(); n != 0 {
				t.Errorf("the entry relay kept %d tunnels", n)
			}
		})
	}
}

// TestAgentFailsOverWhenItsRelayDies kills the relay holding a device: its
// agent walks the relay list it was given, names the dead relay as
// unreachable, lands on a survivor, and users reach the device through any
// survivor again.
func TestAgentFailsOverWhenItsRelayDies(t *testing.T) {
	relays := StartFleet(t, 3, func(c *node.Config) {
		c.Fleet.FreshAfter = time.Minute // the dead relay stays fresh: only the agent and the data path know
	})
	holder, others := HolderFor(t, relays, "dev")
	b := newBackend(t, "b1")
	StartAgent(t, holder, "dev", b.URL, FleetToken(t, relays, auth.KindAgent, "", "dev"))
	waitHolder(t, relays, "dev", holder)
	user := FleetToken(t, relays, auth.KindUser, "u", "dev")
	c := NewClient(t, true)

	dead := holder.Node.Fleet().ID()
	killed := time.Now()
	holder.Node.Fleet().Abandon()
	holder.Node.Close()
	var took time.Duration
	Eventually(t, 10*time.Second, func() error {
		req, _ := http.NewRequest(http.MethodGet, others[0].URL+"/client/dev/echo/x", nil)
		req.Header.Set("Authorization", "Bearer "+user)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		took = time.Since(killed)
		return nil
	})
	t.Logf("first success %s after the kill", took)
	Eventually(t, 5*time.Second, func() error {
		d, err := others[1].Node.Fleet().Device("dev")
		if err == nil && (d.RelayID == dead || d.Agents == 0) {
			err = fmt.Errorf("directory after the failover: %+v", d.DeviceStatus)
		}
		return err
	})
	// The move is an event with its measured time.
	Eventually(t, 5*time.Second, func() error {
		evs, err := others[0].Node.Fleet().Events(t.Context(), 100)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Type == fleet.EventDeviceMoved && e.Device == "dev" && e.From == dead {
				if e.DurationMS <= 0 || e.DurationMS > 5000 {
					t.Errorf("move event %+v: want its measured time", e)
				}
				t.Logf("move event: %s", e.Message)
				return nil
			}
		}
		return errors.New("no device.moved event")
	})
}

// TestSplitAffinityDropsTheOldHolder attaches a second agent of a device to
// another relay than its holder (as an agent that cannot reach the holder
// would): the directory moves there, the old holder drops its agent, and
// that agent, reconnecting, is sent to the new holder.
func TestSplitAffinityDropsTheOldHolder(t *testing.T) {
	relays := StartFleet(t, 3)
	holder, others := HolderFor(t, relays, "dev")
	b := newBackend(t, "b1")
	tok := FleetToken(t, relays, auth.KindAgent, "", "dev")
	StartAgent(t, holder, "dev", b.URL, tok)
	waitHolder(t, relays, "dev", holder)

	// A tunnel that insists on others[0].
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, err := tunnel.Dial(ctx, tunnel.DialConfig{Relay: mustParse(t, others[0].URL), Device: "dev", Token: tok},
		http.Header{tunnel.RedirectedHeader: {"1"}})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		tunnel.Serve(ctx, conn, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "insisting agent") }), testLiveness)
	}()
	defer func() { cancel(); <-served }()

	waitHolder(t, relays, "dev", others[0])
	Eventually(t, 10*time.Second, func() error {
		if n := holder.Node.TunnelSessions(); n != 0 {
			return fmt.Errorf("the old holder still has %d tunnels", n)
		}
		if n := others[0].Node.TunnelSessions(); n != 2 {
			return fmt.Errorf("the new holder has %d tunnels, want 2", n)
		}
		return nil
	})
}

// TestLongPollAgentAtNonHolder points a long-poll agent at a relay that
// does not hold its device (as a round-robin load balancer would): its
// calls are forwarded to the holder, where users' requests meet them.
func TestLongPollAgentAtNonHolder(t *testing.T) {
	relays := StartFleet(t, 3)
	holder, others := HolderFor(t, relays, "dev")
	b := newBackend(t, "b1")
	StartAgent(t, others[0], "dev", b.URL, FleetToken(t, relays, auth.KindAgent, "", "dev"), protocol(agent.ProtocolLongPoll))
	waitHolder(t, relays, "dev", holder)
	user := FleetToken(t, relays, auth.KindUser, "u", "dev")
	for _, entry := range relays {
		e := decodeEcho(t, do(t, http.MethodPost, entry.URL+"/client/dev/echo/lp", user, strings.NewReader("through the holder")))
		if e.Body != "through the holder" {
			t.Errorf("via %s: %+v", entry.URL, e)
		}
	}
	// A websocket needs /server/requeststream to reach the holder too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(others[1].URL, "http")+"/client/dev/ws", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + user}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, got, err := c.Read(ctx); err != nil || string(got) != "ping" {
		t.Fatalf("echo %q, %v", got, err)
	}
	if others[0].Node.Fleet().ID() == holder.Node.Fleet().ID() {
		t.Fatal("test setup: the polled relay is the holder")
	}
}

// TestForwardedPollEndsCleanlyOnShutdown stops a relay while a long poll it
// forwarded waits at the holder: the poll is answered (408 by the holder,
// asking to poll again), never left with an empty 200, which an agent would
// read as a request, and a request the holder hands over meanwhile is never
// dropped between the relays.
func TestForwardedPollEndsCleanlyOnShutdown(t *testing.T) {
	t.Parallel()
	relays := StartFleet(t, 2)
	holder, others := HolderFor(t, relays, "dev")
	through := others[0]
	token := FleetToken(t, relays, auth.KindAgent, "", "dev")
	req, err := http.NewRequest(http.MethodGet, through.URL+"/server/request?server=dev", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(wire.InstanceHeader, "raw-agent")
	type answer struct {
		status int
		body   string
		err    error
	}
	polled := make(chan answer, 1)
	go func() {
		resp, err := NewClient(t, false).Do(req)
		if err != nil {
			polled <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		polled <- answer{status: resp.StatusCode, body: string(b)}
	}()
	waitHolder(t, relays, "dev", holder) // the forwarded poll waits there

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := through.Node.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown of the forwarding relay: %v", err)
	}
	a := <-polled
	if a.err != nil {
		t.Fatalf("the forwarded poll: %v", a.err)
	}
	if a.status != http.StatusRequestTimeout || !strings.Contains(a.body, "poll again") {
		t.Fatalf("the forwarded poll ended %d %q, want 408 asking to poll again", a.status, a.body)
	}
}
