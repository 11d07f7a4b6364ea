package fleettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
)

// interopService is a small implementation of the gRPC interop TestService:
// enough of it for the client cases below, one method per call shape.
type interopService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (interopService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

// UnaryCall answers a payload of the asked size, or the asked status.
func (interopService) UnaryCall(_ context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if s := req.GetResponseStatus(); s.GetCode() != 0 {
		return nil, status.Error(codes.Code(s.GetCode()), s.GetMessage())
	}
	return &testgrpc.SimpleResponse{Payload: payload(int(req.GetResponseSize()))}, nil
}

// StreamingInputCall adds up the sizes of the payloads it was sent.
func (interopService) StreamingInputCall(stream testgrpc.TestService_StreamingInputCallServer) error {
	total := 0
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&testgrpc.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
		}
		if err != nil {
			return err
		}
		total += len(req.GetPayload().GetBody())
	}
}

// StreamingOutputCall sends one payload per response parameter.
func (interopService) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, stream testgrpc.TestService_StreamingOutputCallServer) error {
	for _, p := range req.GetResponseParameters() {
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: payload(int(p.GetSize()))}); err != nil {
			return err
		}
	}
	return nil
}

// FullDuplexCall answers each message as it arrives.
func (interopService) FullDuplexCall(stream testgrpc.TestService_FullDuplexCallServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, p := range req.GetResponseParameters() {
			if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: payload(int(p.GetSize()))}); err != nil {
				return err
			}
		}
	}
}

func payload(n int) *testgrpc.Payload {
	return &testgrpc.Payload{Body: bytes.Repeat([]byte{'g'}, n)}
}

// startInteropGRPC serves interopService on a loopback port (h2c).
func startInteropGRPC(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveInterop(t, lis)
}

func serveInterop(t testing.TB, lis net.Listener) string {
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, interopService{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// streamEnds counts how the request streams a server received ended: on
// their HEADERS frame (no body) or on a DATA frame.
type streamEnds struct {
	mu                sync.Mutex // guards the fields below
	onHeaders, onData int
}

func (e *streamEnds) counts() (onHeaders, onData int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.onHeaders, e.onData
}

// frameListener hands out connections whose incoming HTTP/2 frames are
// parsed on the way, to count how request streams end.
type frameListener struct {
	net.Listener
	ends *streamEnds
}

func (l frameListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &frameConn{Conn: c, ends: l.ends}, nil
}

// frameConn parses the frames read from it (after the client preface).
type frameConn struct {
	net.Conn
	ends *streamEnds
	buf  []byte
	pre  bool // the preface has been skipped
}

func (c *frameConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.buf = append(c.buf, p[:n]...)
	if !c.pre {
		if len(c.buf) < len(http2Preface) {
			return n, err
		}
		c.buf, c.pre = c.buf[len(http2Preface):], true
	}
	for len(c.buf) >= 9 {
		length := int(c.buf[0])<<16 | int(c.buf[1])<<8 | int(c.buf[2])
		if len(c.buf) < 9+length {
			break
		}
		typ, flags := c.buf[3], c.buf[4]
		if flags&0x1 != 0 { // END_STREAM
			c.ends.mu.Lock()
			switch typ {
			case 0x0: // DATA
				c.ends.onData++
			case 0x1: // HEADERS
				c.ends.onHeaders++
			}
			c.ends.mu.Unlock()
		}
		c.buf = c.buf[9+length:]
	}
	return n, err
}

const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// grpcCase is one call of the interop client through a relay.
type grpcCase struct {
	name string
	// fullDuplex: the call needs answers before its request ends, which the
	// long-poll protocol cannot carry (it hands the agent a request whole).
	fullDuplex bool
	run        func(ctx context.Context, c testgrpc.TestServiceClient) error
}

// grpcCases are the call shapes of the gRPC interop suite that a relay must
// carry: every kind of stream, large messages, empty streams and statuses.
var grpcCases = []grpcCase{
	{"grpc empty unary", false, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
		return err
	}},
	{"grpc unary", false, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		return unary(ctx, c, 10, 20)
	}},
	{"grpc large unary", false, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		return unary(ctx, c, 271828, 314159)
	}},
	{"grpc error status", false, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.FailedPrecondition), Message: "arm not homed"}})
		if s := status.Convert(err); s.Code() != codes.FailedPrecondition || s.Message() != "arm not homed" {
			return fmt.Errorf("got %v, want FailedPrecondition: arm not homed", err)
		}
		return nil
	}},
	{"grpc client streaming", false, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		return clientStream(ctx, c, 27182, 8, 1828, 45904)
	}},
	{"grpc client streaming, no messages", false, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		return clientStream(ctx, c)
	}},
	{"grpc server streaming", false, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		sizes := []int32{31415, 9, 2653, 58979}
		req := &testgrpc.StreamingOutputCallRequest{}
		for _, n := range sizes {
			req.ResponseParameters = append(req.ResponseParameters, &testgrpc.ResponseParameters{Size: n})
		}
		stream, err := c.StreamingOutputCall(ctx, req)
		if err != nil {
			return err
		}
		for i, n := range sizes {
			msg, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("message %d: %w", i, err)
			}
			if len(msg.GetPayload().GetBody()) != int(n) {
				return fmt.Errorf("message %d: %d bytes, want %d", i, len(msg.GetPayload().GetBody()), n)
			}
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			return fmt.Errorf("after the last message: %v, want EOF", err)
		}
		return nil
	}},
	{"grpc bidi ping-pong", true, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		stream, err := c.FullDuplexCall(ctx)
		if err != nil {
			return err
		}
		for i, n := range []int32{31415, 9, 2653, 58979} {
			if err := stream.Send(&testgrpc.StreamingOutputCallRequest{ResponseParameters: []*testgrpc.ResponseParameters{{Size: n}}, Payload: payload(int(n))}); err != nil {
				return fmt.Errorf("send %d: %w", i, err)
			}
			msg, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("receive %d: %w", i, err)
			}
			if len(msg.GetPayload().GetBody()) != int(n) {
				return fmt.Errorf("message %d: %d bytes, want %d", i, len(msg.GetPayload().GetBody()), n)
			}
		}
		if err := stream.CloseSend(); err != nil {
			return err
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			return fmt.Errorf("after the last message: %v, want EOF", err)
		}
		return nil
	}},
	{"grpc empty bidi stream", false, func(ctx context.Context, c testgrpc.TestServiceClient) error {
		stream, err := c.FullDuplexCall(ctx)
		if err != nil {
			return err
		}
		if err := stream.CloseSend(); err != nil {
			return err
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			return fmt.Errorf("got %v, want EOF", err)
		}
		return nil
	}},
}

func unary(ctx context.Context, c testgrpc.TestServiceClient, in, out int) error {
	resp, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{ResponseSize: int32(out), Payload: payload(in)})
	if err != nil {
		return err
	}
	if n := len(resp.GetPayload().GetBody()); n != out {
		return fmt.Errorf("answer of %d bytes, want %d", n, out)
	}
	return nil
}

// clientStream sends payloads of the given sizes and checks their total.
func clientStream(ctx context.Context, c testgrpc.TestServiceClient, sizes ...int) error {
	stream, err := c.StreamingInputCall(ctx)
	if err != nil {
		return err
	}
	total := 0
	for i, n := range sizes {
		if err := stream.Send(&testgrpc.StreamingInputCallRequest{Payload: payload(n)}); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
		total += n
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return err
	}
	if got := int(resp.GetAggregatedPayloadSize()); got != total {
		return fmt.Errorf("the backend counted %d bytes, want %d", got, total)
	}
	return nil
}
