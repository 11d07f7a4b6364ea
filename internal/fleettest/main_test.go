package fleettest

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// relay, agent, backend and client a test starts must be stopped by it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestGRPCCompressedThroughRelay: a gzip-compressed gRPC call must work
// through the relay. The server's answer carries a Grpc-Encoding response
// header; moving it into the trailers (as relay.promoteGRPC does with every
// Grpc-* header) leaves the client with compressed messages it cannot read:
// "grpc: compressed flag set with identity or empty encoding".
// (It belongs beside TestGRPCThroughRelay in grpc_test.go.)
func TestGRPCCompressedThroughRelay(t *testing.T) {
	forEachProtocol(t, func(t *testing.T, proto string) {
		r := StartRelay(t)
		addr, hs := startGRPC(t)
		hs.SetServingStatus("robot.Arm", healthpb.HealthCheckResponse_SERVING)
		StartAgent(t, r, "grpc-dev", "http://"+addr, r.Token(t, auth.KindAgent, "grpc agent", "grpc-dev"),
			protocol(proto), func(c *agent.Config) { c.BackendH2C = true })
		r.WaitDevice(t, "grpc-dev")
		user := r.Token(t, auth.KindUser, "alice", "grpc-dev")

		conn, err := grpc.NewClient(strings.TrimPrefix(r.URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "x-server-name", "grpc-dev", "x-switchboard-token", user)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "robot.Arm"}, grpc.UseCompressor(gzip.Name))
		if err != nil {
			t.Fatalf("gzip-compressed Check: %v", err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("status %v", resp.Status)
		}
	})
}
