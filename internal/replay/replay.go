// Package replay decides whether a request whose round trip failed may be
// sent again: how far the request got, from the failure (Classify), and
// whether it may reach its device twice, from the request (Repeatable).
// The tunnel pool and the fleet router both ask it, so that a request lost
// on an agent's tunnel and one lost on the way to another relay follow one
// rule:
//
//	switch replay.Classify(err) {
//	case replay.Refused, replay.Unopened: // nothing was sent: send it elsewhere
//	case replay.Lost, replay.Reset:       // it may have reached the device
//		if replay.Repeatable(req) { ... send it once more }
//	}
//
// Only a failure before any byte of the response is a failure here: once a
// round trip returned a response, the user has its bytes, and a relay
// never sends the request again.
package replay

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	"golang.org/x/net/http2"

	"github.com/switchboard-relay/switchboard/internal/mux"
)

// Failure says how far a request got before its round trip failed.
type Failure uint8

const (
	// Other is not a lost connection: the user went away, a deadline
	// passed, the request was bad, or the error is unknown. Never sent
	// again.
	Other Failure = iota
	// Refused: no connection could be made to the peer (refused,
	// unreachable): nothing was sent, and the peer is gone.
	Refused
	// Unopened: the connection closed, or would take no new stream
	// (GOAWAY, REFUSED_STREAM), before the request went out: nothing was
	// sent, and the peer may be fine.
	Unopened
	// Lost: the connection died with the request in flight and no answer
	// (reset, EOF, a GOAWAY and a close, unanswered pings): the request
	// may have reached the device, and the peer is likely gone.
	Lost
	// Reset: the peer reset the request's stream before answering: the
	// request may have reached the device; the connection lives.
	Reset
)

var failureNames = [...]string{Other: "other", Refused: "refused", Unopened: "unopened", Lost: "lost", Reset: "reset"}

func (f Failure) String() string { return failureNames[f] }

// Sent reports whether a request that failed so may have reached its
// device.
func (f Failure) Sent() bool { return f == Lost || f == Reset }

// Classify tells how far the request of a failed round trip got, from
// typed errors: the syscall errors of its connection, *net.OpError, the
// HTTP/2 stream and connection errors, and the few errors net/http and
// golang.org/x/net/http2 keep unexported (see libraryFailure).
func Classify(err error) Failure {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Other
	}
	if f := libraryFailure(err); f != Other {
		return f
	}
	if f := muxFailure(err); f != Other {
		return f
	}
	if errors.Is(err, http2.ErrNoCachedConn) {
		return Unopened
	}
	var se http2.StreamError // net/http's own HTTP/2 stream errors convert to it too
	if errors.As(err, &se) {
		if se.Code == http2.ErrCodeRefusedStream {
			return Unopened // RFC 9113, section 8.7: the peer did not process it
		}
		return Reset
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return Refused
	}
	var ga http2.GoAwayError
	var ce http2.ConnectionError
	if op != nil || errors.As(err, &ga) || errors.As(err, &ce) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ETIMEDOUT) {
		return Lost
	}
	return Other
}

// muxFailure classifies the errors of the tunnel's multiplexer (package
// mux), which carries version 2 tunnels.
func muxFailure(err error) Failure {
	var oe *mux.OpenError
	if errors.As(err, &oe) || errors.Is(err, mux.ErrGoAway) || errors.Is(err, mux.ErrStreamsExhausted) {
		return Unopened // the stream never reached the peer
	}
	var re *mux.ResetError
	if errors.As(err, &re) {
		switch {
		case re.Refused():
			return Unopened // the peer did not process it
		case re.Remote:
			return Reset
		}
		return Other // this end gave up on it
	}
	if errors.Is(err, mux.ErrSessionClosed) || errors.Is(err, mux.ErrTimeout) {
		return Lost
	}
	return Other
}

// The texts of errors net/http and golang.org/x/net/http2 keep unexported,
// as both spell them. TestLibraryWording pins them against the libraries.
const (
	textNotEstablished = "http2: client conn could not be established" // a new connection closed before its first request went out
	textUnusable       = "http2: client conn not usable"               // the connection takes no new streams (after a GOAWAY)
	textGotGoAway      = "http2: Transport received Server's graceful shutdown GOAWAY"
	textConnLost       = "http2: client connection lost" // pings unanswered with streams in flight
	textForceClosed    = "http2: client connection force closed via ClientConn.Close"
	textGoAwayClosed   = "http2: server sent GOAWAY and closed the connection" // net/http's own GoAwayError, then its fields
)

// libraryFailure classifies the errors the HTTP libraries keep unexported,
// by their text: the one place where a failure is told by its words.
func libraryFailure(err error) Failure {
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch s := e.Error(); {
		case s == textNotEstablished, s == textUnusable, s == textGotGoAway:
			return Unopened
		case s == textConnLost, s == textForceClosed, strings.HasPrefix(s, textGoAwayClosed):
			return Lost
		}
	}
	return Other
}

// Repeatable reports whether req may reach its device a second time, and
// makes it ready to be sent again when it may: its method is idempotent
// (RFC 9110, section 9.2.2: GET, HEAD, OPTIONS, TRACE) or it carries an
// Idempotency-Key, its user is still waiting, and its body, if any, can be
// had again (GetBody), which it rewinds. An upgrade (a websocket) may be
// repeated too: a round trip that failed returned no 101, so the user has
// sent nothing over it yet.
func Repeatable(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
	default:
		if req.Header.Get("Idempotency-Key") == "" {
			return false
		}
	}
	return req.Context().Err() == nil && Rewind(req)
}

// Rewind makes req's body ready to be sent again and reports whether it
// could: a request without a body can always be sent again, one with a body
// only when GetBody gives it anew.
func Rewind(req *http.Request) bool {
	if req.Body == nil || req.Body == http.NoBody {
		return true
	}
	if req.GetBody == nil {
		return false
	}
	body, err := req.GetBody()
	if err != nil {
		return false
	}
	req.Body = body
	return true
}
