package mux

import (
	"errors"
	"fmt"
)

// Reset codes. A stream's RESET carries one; the application may define
// its own from CodeApplication up.
const (
	// CodeCancel: the sender gave up on the stream (a cancelled request).
	CodeCancel uint32 = 0
	// CodeRefused: the stream was never processed, so opening it again,
	// here or elsewhere, is safe.
	CodeRefused uint32 = 1
	// CodeClosed: the sender closed the stream; it reads nothing more.
	CodeClosed uint32 = 2
	// CodeFlowControl: the peer sent more than the stream's credit.
	CodeFlowControl uint32 = 3
	// CodeApplication is the first code free for the application's use.
	CodeApplication uint32 = 0x100
)

// ResetError is what reads and writes of a reset stream return.
type ResetError struct {
	Code   uint32
	Remote bool // the peer reset the stream, not this end
}

func (e *ResetError) Error() string {
	by := "locally"
	if e.Remote {
		by = "by the peer"
	}
	return fmt.Sprintf("mux: stream reset %s (%s)", by, codeName(e.Code))
}

// Refused reports whether the stream was never processed: opening it again
// is safe.
func (e *ResetError) Refused() bool { return e.Code == CodeRefused }

func codeName(c uint32) string {
	switch c {
	case CodeCancel:
		return "cancel"
	case CodeRefused:
		return "refused"
	case CodeClosed:
		return "closed"
	case CodeFlowControl:
		return "flow control"
	}
	return fmt.Sprintf("code %#x", c)
}

var (
	// ErrSessionClosed is returned by a closed session and its streams.
	ErrSessionClosed = errors.New("mux: session closed")
	// ErrGoAway means the peer accepts no new streams (it drains).
	ErrGoAway = errors.New("mux: peer accepts no new streams")
	// ErrTimeout means the peer sent nothing for the liveness limit.
	ErrTimeout = errors.New("mux: peer silent past the liveness limit")
	// ErrStreamsExhausted means the session has opened all the streams its
	// ids can name; open a new session.
	ErrStreamsExhausted = errors.New("mux: stream ids exhausted")

	// errIdle, from a read, means that the socket is empty and the
	// session idle: the reader parks it, or waits for the next bytes in a
	// fresh goroutine (see Session.readLoop).
	errIdle = errors.New("mux: the session is idle")
)

// OpenError is a failure to open a stream (Session.Open): nothing of it
// reached the peer, so opening it again, on another session, is safe.
type OpenError struct{ Err error }

func (e *OpenError) Error() string { return "mux: open a stream: " + e.Err.Error() }

// Unwrap returns why the stream could not open.
func (e *OpenError) Unwrap() error { return e.Err }
