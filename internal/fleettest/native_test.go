package fleettest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
)

// streamingService implements the client-streaming and bidi calls of the
// gRPC interop test service.
type streamingService struct {
	testpb.UnimplementedTestServiceServer
}

func (streamingService) StreamingInputCall(stream testpb.TestService_StreamingInputCallServer) error {
	total := 0
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
		}
		if err != nil {
			return err
		}
		total += len(req.GetPayload().GetBody())
	}
}

func (streamingService) FullDuplexCall(stream testpb.TestService_FullDuplexCallServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		size := req.GetResponseParameters()[0].GetSize()
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: make([]byte, size)}}); err != nil {
			return err
		}
	}
}

func TestNativeGRPCStreaming(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	testpb.RegisterTestServiceServer(srv, streamingService{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, md := grpcDevice(t, agent.ProtocolNative, "grpc-dev", lis.Addr().String())
	client := testpb.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = metadata.NewOutgoingContext(ctx, md)

	t.Run("client streaming", func(t *testing.T) {
		stream, err := client.StreamingInputCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 50; i++ {
			if err := stream.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: make([]byte, 1000)}}); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil || resp.AggregatedPayloadSize != 50_000 {
			t.Fatalf("aggregated %d, err %v; want 50000", resp.GetAggregatedPayloadSize(), err)
		}
	})
	t.Run("bidi ping-pong", func(t *testing.T) {
		stream, err := client.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 100; i++ {
			req := &testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{Size: int32(i)}}}
			if err := stream.Send(req); err != nil {
				t.Fatalf("ping %d: %v", i, err)
			}
			resp, err := stream.Recv() // the pong must arrive before the next ping is sent
			if err != nil || len(resp.GetPayload().GetBody()) != i {
				t.Fatalf("pong %d: %d bytes, err %v", i, len(resp.GetPayload().GetBody()), err)
			}
		}
		stream.CloseSend()
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("end of stream: %v, want EOF", err)
		}
	})
}

// blockingBackend counts the requests it holds open and sees cancelled.
type blockingBackend struct {
	started   atomic.Int64
	cancelled atomic.Int64
	release   chan struct{}
}

func (b *blockingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/block" {
		io.WriteString(w, "quick")
		return
	}
	b.started.Add(1)
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	select {
	case <-r.Context().Done():
		b.cancelled.Add(1)
	case <-b.release:
	}
}

func TestCancellationReachesTheBackend(t *testing.T) {
	t.Parallel()
	forEachProtocol(t, func(t *testing.T, proto string) {
		r := StartRelay(t)
		bb := &blockingBackend{release: make(chan struct{})}
		backend := httptestServer(t, bb)
		StartAgent(t, r, "dev", backend, r.Token(t, auth.KindAgent, "a", "dev"), protocol(proto))
		r.WaitDevice(t, "dev")
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/client/dev/block", nil)
		req.Header.Set("X-Switchboard-Token", r.Token(t, auth.KindUser, "u"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		Eventually(t, 5*time.Second, func() error {
			if bb.started.Load() == 0 {
				return errors.New("backend has not seen the request")
			}
			return nil
		})
		cancel() // the user goes away
		Eventually(t, 10*time.Second, func() error {
			if bb.cancelled.Load() == 0 {
				return errors.New("the backend request was not cancelled")
			}
			return nil
		})
	})
}

func TestNativeAgentsShareLoadAndFailOver(t *testing.T) {
	r := StartRelay(t)
	tok := r.Token(t, auth.KindAgent, "a", "dev")
	b1 := &blockingBackend{release: make(chan struct{})}
	b2 := &blockingBackend{release: make(chan struct{})}
	a1 := StartAgent(t, r, "dev", httptestServer(t, b1), tok, protocol(agent.ProtocolNative))
	StartAgent(t, r, "dev", httptestServer(t, b2), tok, protocol(agent.ProtocolNative))
	user := r.Token(t, auth.KindUser, "u")
	Eventually(t, 10*time.Second, func() error {
		if n := r.Node.TunnelSessions(); n != 2 {
			return errors.New("waiting for two tunnels")
		}
		return nil
	})
	// Two long requests: least in-flight puts one on each agent.
	for i := 0; i < 2; i++ {
		resp := do(t, http.MethodGet, r.URL+"/client/dev/block", user, nil)
		defer resp.Body.Close()
	}
	Eventually(t, 5*time.Second, func() error {
		if b1.started.Load() != 1 || b2.started.Load() != 1 {
			return errors.New("the two long requests did not spread over both agents")
		}
		return nil
	})
	// One agent dies: new requests go to the other at once, none fails.
	a1.Stop()
	Eventually(t, 5*time.Second, func() error {
		if n := r.Node.TunnelSessions(); n != 1 {
			return errors.New("the dead agent's tunnel is still in the pool")
		}
		return nil
	})
	for i := 0; i < 20; i++ {
		resp := do(t, http.MethodGet, r.URL+"/client/dev/quick", user, nil)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "quick" {
			t.Fatalf("request %d after failover: %s %q", i, resp.Status, body)
		}
	}
}

func TestNativeStreamedUploadHoldsLittle(t *testing.T) {
	size := int64(1 << 30)
	if testing.Short() || raceEnabled {
		size = 128 << 20
	}
	r := StartRelay(t)
	var got atomic.Int64
	backend := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Store(n)
	}))
	StartAgent(t, r, "dev", backend, r.Token(t, auth.KindAgent, "a", "dev"), protocol(agent.ProtocolNative))
	r.WaitDevice(t, "dev")

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	done := make(chan struct{})
	var peak atomic.Uint64
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var m runtime.MemStats
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
			}
		}
	}()
	resp := do(t, http.MethodPut, r.URL+"/client/dev/upload", r.Token(t, auth.KindUser, "u"), io.LimitReader(zeros{}, size))
	close(done)
	if resp.StatusCode != http.StatusOK || got.Load() != size {
		t.Fatalf("upload: %s, backend got %d of %d bytes", resp.Status, got.Load(), size)
	}
	growth := int64(peak.Load()) - int64(before.HeapInuse)
	t.Logf("streamed %d MiB; peak heap growth across user, relay, agent and backend: %.1f MiB", size>>20, float64(growth)/(1<<20))
	if growth > 48<<20 {
		t.Fatalf("heap grew by %.1f MiB while streaming %d MiB: the upload is being buffered", float64(growth)/(1<<20), size>>20)
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
