package limit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/switchboard-relay/switchboard/internal/httperr"
)

// ErrTooManyFailures matches every *RefusedError with errors.Is.
var ErrTooManyFailures = errors.New("too many failed authentications")

// RefusedError is the answer to a client refused for failing to
// authenticate too often: 429 Too Many Requests with Retry-After. It has
// the HTTPStatus and RetryAfterDelay methods the relay's error writers
// understand.
type RefusedError struct {
	IP         netip.Addr    // the client's address as the relay saw it
	RetryAfter time.Duration // until the refusal window ends
}

// Error says who is refused and when to come back, e.g. "too many failed
// sign-ins from 203.0.113.9; try again in 8s".
func (e *RefusedError) Error() string {
	who := "your address"
	if e.IP.IsValid() {
		who = e.IP.String()
	}
	return fmt.Sprintf("too many failed sign-ins from %s; try again in %v", who, e.wait())
}

// Is makes the error match ErrTooManyFailures.
func (e *RefusedError) Is(target error) bool { return target == ErrTooManyFailures }

// HTTPStatus returns 429.
func (e *RefusedError) HTTPStatus() int { return http.StatusTooManyRequests }

// RetryAfterDelay returns the time until the refusal ends, in whole seconds
// rounded up, as Retry-After carries it.
func (e *RefusedError) RetryAfterDelay() time.Duration { return e.wait() }

// WriteHTTP answers w with the error: status, Retry-After and the message as
// plain text, for handlers that do not have an error writer of their own.
func (e *RefusedError) WriteHTTP(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(int(e.wait()/time.Second)))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusTooManyRequests)
	fmt.Fprintln(w, e.Error())
}

// wait is RetryAfter rounded up to whole seconds, at least one.
func (e *RefusedError) wait() time.Duration {
	return max(time.Second, (e.RetryAfter + time.Second - 1).Truncate(time.Second))
}

var (
	_ httperr.StatusError     = (*RefusedError)(nil)
	_ httperr.RetryAfterError = (*RefusedError)(nil)
)
