// Package httperr owns the error that carries an HTTP status, and how a
// listener writes one. A component returns an *Error (or a type of its own
// that implements StatusError, when callers need its fields); the handler
// that answers finds the status in the error's chain with errors.As and
// writes it once: Write and Text for the listeners users and agents reach
// (plain text, a sentence and a newline), StatusOf and MessageOf for the
// operator API, which puts the same in its JSON.
//
//	return &httperr.Error{Status: http.StatusServiceUnavailable, RetryAfter: time.Second,
//		Message: "this relay is shutting down; retry in a moment", Err: ErrDraining}
//	...
//	httperr.Write(w, err) // 503, Retry-After: 1, the message
package httperr

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
)

// StatusError is an error that knows the HTTP status to answer with.
type StatusError interface {
	error
	HTTPStatus() int
}

// RetryAfterError is implemented by errors that say when to come back.
type RetryAfterError interface {
	error
	RetryAfterDelay() time.Duration
}

// Error is a failure a user, an agent or an operator should see as an HTTP
// status with a sentence a person can act on.
type Error struct {
	Status     int           // the HTTP status to answer with
	Message    string        // a sentence a person can act on
	RetryAfter time.Duration // when > 0, sent as Retry-After
	Err        error         // the cause, if any; matched by errors.Is
}

var (
	_ StatusError     = (*Error)(nil)
	_ RetryAfterError = (*Error)(nil)
)

// New returns an error answered with status and msg.
func New(status int, msg string) *Error { return &Error{Status: status, Message: msg} }

// Error returns the message, or the cause's when there is none.
func (e *Error) Error() string {
	switch {
	case e.Message != "":
		return e.Message
	case e.Err != nil:
		return e.Err.Error()
	}
	return http.StatusText(e.Status)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// HTTPStatus returns the status to answer with.
func (e *Error) HTTPStatus() int { return e.Status }

// RetryAfterDelay returns when the client may retry, or 0.
func (e *Error) RetryAfterDelay() time.Duration { return e.RetryAfter }

// StatusOf returns the status of the StatusError in err's chain, or
// fallback when none says.
func StatusOf(err error, fallback int) int {
	if se, ok := errors.AsType[StatusError](err); ok {
		return se.HTTPStatus()
	}
	return fallback
}

// MessageOf returns what the answer to err says: the message of the
// StatusError in its chain, without what wraps it, or err's own.
func MessageOf(err error) string {
	if se, ok := errors.AsType[StatusError](err); ok {
		return se.Error()
	}
	return err.Error()
}

// Has reports whether err's chain holds a StatusError.
func Has(err error) bool {
	_, ok := errors.AsType[StatusError](err)
	return ok
}

// Write answers err in plain text: the status and message of the
// StatusError in its chain (500 and err's own message when there is none),
// with Retry-After, in whole seconds rounded up, when an error in the
// chain names a delay.
func Write(w http.ResponseWriter, err error) {
	if ra, ok := errors.AsType[RetryAfterError](err); ok && ra.RetryAfterDelay() > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((ra.RetryAfterDelay()+time.Second-1)/time.Second)))
	}
	Text(w, StatusOf(err, http.StatusInternalServerError), MessageOf(err))
}

// Text answers status with msg, a sentence, as the body users and agents
// read: plain text, one line, never sniffed as anything else.
func Text(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	io.WriteString(w, msg+"\n")
}
