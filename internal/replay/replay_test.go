package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/net/http2"

	"github.com/switchboard-relay/switchboard/internal/mux"
)

// TestClassify reads failures as the transports report them, wrapped as
// the router and the HTTP libraries wrap them.
func TestClassify(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, c := range []struct {
		name string
		err  error
		want Failure
	}{
		{"no error", nil, Other},
		{"the user went away", fmt.Errorf("forward: %w", context.Canceled), Other},
		{"a deadline", context.DeadlineExceeded, Other},
		{"an unknown error", errors.New("device said no"), Other},
		{"a look-alike of a stream reset", errors.New("http2: stream reset"), Other},

		{"refused at connect", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, Refused},
		{"no route at connect", fmt.Errorf("relay x: %w", &net.OpError{Op: "dial", Err: syscall.EHOSTUNREACH}), Refused},
		{"a dial that timed out", &net.OpError{Op: "dial", Err: errors.New("i/o timeout")}, Refused},

		{"a new connection closed unused", errors.New(textNotEstablished), Unopened},
		{"a connection taking no new streams", fmt.Errorf("relay x: %w", errors.New(textUnusable)), Unopened},
		{"a graceful GOAWAY above the stream", errors.New(textGotGoAway), Unopened},
		{"no cached connection", http2.ErrNoCachedConn, Unopened},
		{"a refused stream", http2.StreamError{StreamID: 3, Code: http2.ErrCodeRefusedStream}, Unopened},

		{"a reset connection", reset, Lost},
		{"a reset, HTTP/1.1's wording around it", fmt.Errorf("readLoopPeekFailLocked: %w", reset), Lost},
		{"a broken pipe", &net.OpError{Op: "write", Err: syscall.EPIPE}, Lost},
		{"EOF", io.EOF, Lost},
		{"an unexpected EOF, wrapped", fmt.Errorf("relay x did not answer: %w", io.ErrUnexpectedEOF), Lost},
		{"a closed connection", net.ErrClosed, Lost},
		{"pings unanswered", errors.New(textConnLost), Lost},
		{"closed by this side", errors.New(textForceClosed), Lost},
		{"a GOAWAY and a close", errors.New(textGoAwayClosed + "; LastStreamID=5, ErrCode=NO_ERROR, debug=\"\""), Lost},
		{"x/net's GOAWAY and a close", http2.GoAwayError{LastStreamID: 5}, Lost},
		{"a connection error", http2.ConnectionError(http2.ErrCodeProtocol), Lost},

		{"a stream reset by the peer", http2.StreamError{StreamID: 3, Code: http2.ErrCodeInternal}, Reset},
		{"a cancelled stream", fmt.Errorf("relay x: %w", http2.StreamError{StreamID: 3, Code: http2.ErrCodeCancel}), Reset},

		// Version 2 tunnels: package mux's errors, as net/http wraps them.
		{"a stream that could not open", fmt.Errorf("dial: %w", &mux.OpenError{Err: mux.ErrSessionClosed}), Unopened},
		{"a stream that could not open, the user gone", &mux.OpenError{Err: context.Canceled}, Other},
		{"a session that drains", mux.ErrGoAway, Unopened},
		{"a stream the agent refused", fmt.Errorf("readLoopPeekFailLocked: %w", &mux.ResetError{Code: mux.CodeRefused, Remote: true}), Unopened},
		{"a stream the agent reset", &mux.ResetError{Code: mux.CodeApplication + 7, Remote: true}, Reset},
		{"a stream this end reset", &mux.ResetError{Code: mux.CodeCancel}, Other},
		{"a session that died under the stream", fmt.Errorf("readLoopPeekFailLocked: %w", mux.ErrSessionClosed), Lost},
		{"a silent agent", mux.ErrTimeout, Lost},
	} {
		if got := Classify(c.err); got != c.want {
			t.Errorf("%s (%v): %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestRepeatable checks which requests may reach their device twice.
func TestRepeatable(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	req := func(method string, body io.Reader, header ...string) *http.Request {
		r, err := http.NewRequest(method, "http://dev/", body)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}
	for _, c := range []struct {
		name string
		req  *http.Request
		want bool
	}{
		{"GET", req(http.MethodGet, nil), true},
		{"HEAD", req(http.MethodHead, nil), true},
		{"OPTIONS", req(http.MethodOptions, nil), true},
		{"GET with a body that can be had again", req(http.MethodGet, strings.NewReader("q")), true},
		{"GET with a body read once", req(http.MethodGet, io.NopCloser(strings.NewReader("q"))), false},
		{"a websocket before its 101", req(http.MethodGet, nil, "Connection", "Upgrade", "Upgrade", "websocket"), true},
		{"POST", req(http.MethodPost, strings.NewReader("q")), false},
		{"PATCH", req(http.MethodPatch, strings.NewReader("q")), false},
		{"DELETE", req(http.MethodDelete, nil), false},
		{"POST with an Idempotency-Key", req(http.MethodPost, strings.NewReader("q"), "Idempotency-Key", "k1"), true},
		{"the user went away", httptest.NewRequest(http.MethodGet, "http://dev/", nil).WithContext(canceled), false},
	} {
		if got := Repeatable(c.req); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}

	// A rewound body is the whole body again.
	r := req(http.MethodGet, strings.NewReader("whole"))
	io.ReadAll(r.Body)
	if !Repeatable(r) {
		t.Fatal("GET with a rewindable body")
	}
	if b, _ := io.ReadAll(r.Body); string(b) != "whole" {
		t.Fatalf("rewound body %q", b)
	}
}
