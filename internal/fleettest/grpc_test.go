package fleettest

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
)

// startGRPC serves the standard health service on a loopback port (h2c).
func startGRPC(t *testing.T) (addr string, hs *health.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs = health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), hs
}

func TestGRPCThroughRelay(t *testing.T) {
	forEachProtocol(t, testGRPC)
}

// grpcDevice serves device through a new relay and an agent of proto that
// speaks h2c to the gRPC server at addr, and returns a client connection to
// the relay and the metadata that names device with a user token for it.
func grpcDevice(t *testing.T, proto, device, addr string) (*grpc.ClientConn, metadata.MD) {
	t.Helper()
	r := StartRelay(t)
	StartAgent(t, r, device, "http://"+addr, r.Token(t, auth.KindAgent, "grpc agent", device),
		protocol(proto), func(c *agent.Config) { c.BackendH2C = true })
	r.WaitDevice(t, device)
	conn, err := grpc.NewClient(strings.TrimPrefix(r.URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, metadata.Pairs("x-server-name", device, "x-switchboard-token", r.Token(t, auth.KindUser, "alice", device))
}

func testGRPC(t *testing.T, proto string) {
	addr, hs := startGRPC(t)
	hs.SetServingStatus("robot.Arm", healthpb.HealthCheckResponse_SERVING)
	conn, md := grpcDevice(t, proto, "grpc-dev", addr)
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ctx = metadata.NewOutgoingContext(ctx, md)

	t.Run("unary", func(t *testing.T) {
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "robot.Arm"})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("status %v", resp.Status)
		}
	})
	t.Run("unary gzip-compressed", func(t *testing.T) {
		// The answer's Grpc-Encoding must stay a header: moved into the
		// trailers, it leaves the client unable to read the messages.
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "robot.Arm"}, grpc.UseCompressor(gzip.Name))
		if err != nil {
			t.Fatalf("gzip-compressed Check: %v", err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("status %v", resp.Status)
		}
	})
	t.Run("unary error status (trailers-only)", func(t *testing.T) {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.Such"})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("Check of an unknown service: %v, want NotFound", err)
		}
	})
	t.Run("server streaming", func(t *testing.T) {
		stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{Service: "robot.Arm"})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		want := []healthpb.HealthCheckResponse_ServingStatus{
			healthpb.HealthCheckResponse_SERVING,
			healthpb.HealthCheckResponse_NOT_SERVING,
			healthpb.HealthCheckResponse_SERVING,
		}
		for i, w := range want {
			if i > 0 {
				hs.SetServingStatus("robot.Arm", w) // only after the previous message arrived
			}
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
			if msg.Status != w {
				t.Fatalf("message %d: %v, want %v", i, msg.Status, w)
			}
		}
	})
	t.Run("unauthorized", func(t *testing.T) {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-server-name", "grpc-dev")
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "robot.Arm"})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Check without a token: %v, want Unauthenticated", err)
		}
	})
}

// TestGRPCInteropThroughRelay runs the interop call shapes through each kind
// of agent. The empty client stream is the sharp one: a backend must see its
// request body end (an empty DATA frame), not a request without one.
func TestGRPCInteropThroughRelay(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		conn, md := grpcDevice(t, proto, "interop-dev", startInteropGRPC(t))
		client := testgrpc.NewTestServiceClient(conn)
		for _, c := range grpcCases {
			t.Run(c.name, func(t *testing.T) {
				if c.fullDuplex && proto == agent.ProtocolLongPoll {
					t.Skip("the long-poll protocol hands the agent a request whole: no answers before the request ends")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := c.run(metadata.NewOutgoingContext(ctx, md), client); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// TestGRPCEmptyClientStreamEndsOnData: a client stream of no messages reaches
// the gRPC backend as the client sent it, a stream ended by an empty DATA
// frame, through either kind of agent; sent ended on its HEADERS frame, it is
// a different request, which some servers never answer.
func TestGRPCEmptyClientStreamEndsOnData(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ends := &streamEnds{}
		conn, md := grpcDevice(t, proto, "interop-dev", serveInterop(t, frameListener{Listener: lis, ends: ends}))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := clientStream(metadata.NewOutgoingContext(ctx, md), testgrpc.NewTestServiceClient(conn)); err != nil {
			t.Fatal(err)
		}
		if onHeaders, onData := ends.counts(); onHeaders != 0 || onData != 1 {
			t.Errorf("the backend saw %d request streams end on HEADERS and %d on DATA, want 0 and 1", onHeaders, onData)
		}
	})
}
