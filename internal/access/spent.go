package access

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/httperr"
)

// ErrSpent is the error of a code used a second time: a 401.
var ErrSpent error = httperr.New(http.StatusUnauthorized, "this access code was already used; codes work once: ask for a new one")

// ErrBusy is the error of a code that cannot be recorded because too many
// codes are live at once: a 503, to come back in a few seconds.
var ErrBusy error = &httperr.Error{Status: http.StatusServiceUnavailable, RetryAfter: 5 * time.Second,
	Message: "this relay is tracking too many access codes right now; try again in a few seconds"}

// DefaultMaxSpent bounds the codes a Spent set remembers at once. Codes
// live a minute at most, so this allows over 1,500 code uses a second.
const DefaultMaxSpent = 100_000

// Spent remembers the codes used here until they expire, so that each
// works once. It is safe for concurrent use; its memory is bounded by Max.
type Spent struct {
	// Max is the most codes remembered at once; 0 means DefaultMaxSpent.
	// When full of live codes, Use refuses with ErrBusy rather than forget
	// one that could then be used again.
	Max int

	mu    sync.Mutex // guards the fields below
	until map[string]time.Time
	next  time.Time // no entry expires before this; the earliest sweep
}

// Use records the use of the code with nonce, alive until expires, and
// fails with ErrSpent if it was used before.
func (s *Spent) Use(nonce string, expires, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = map[string]time.Time{}
	}
	if exp, ok := s.until[nonce]; ok && now.Before(exp) {
		return ErrSpent
	}
	max := s.Max
	if max <= 0 {
		max = DefaultMaxSpent
	}
	if len(s.until) >= max && !now.Before(s.next) {
		s.sweepLocked(now)
	}
	if len(s.until) >= max {
		return ErrBusy
	}
	s.until[nonce] = expires
	if s.next.IsZero() || expires.Before(s.next) {
		s.next = expires
	}
	return nil
}

// Mark records a code used elsewhere in the fleet, so that it is refused
// here too; it never fails.
func (s *Spent) Mark(nonce string, expires, now time.Time) { _ = s.Use(nonce, expires, now) }

// Len returns how many codes are remembered.
func (s *Spent) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.until)
}

// sweepLocked drops the expired codes.
func (s *Spent) sweepLocked(now time.Time) {
	s.next = time.Time{}
	for n, exp := range s.until {
		if !now.Before(exp) {
			delete(s.until, n)
			continue
		}
		if s.next.IsZero() || exp.Before(s.next) {
			s.next = exp
		}
	}
}

// Ticket is what a relay passes on about a code it accepted, so that the
// relay holding the device can enforce its single use: the nonce and when
// the code expires.
type Ticket struct {
	Nonce   string
	Expires time.Time
}

// TicketHeader carries a ticket on a forward between relays. A relay drops
// it from every request that is not a signed forward.
const TicketHeader = "X-Switchboard-Code"

type ticketKey struct{}

// WithTicket returns ctx carrying t.
func WithTicket(ctx context.Context, t Ticket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// TicketFrom returns the ticket ctx carries.
func TicketFrom(ctx context.Context) (Ticket, bool) {
	t, ok := ctx.Value(ticketKey{}).(Ticket)
	return t, ok
}

// SetHeader writes t to h.
func (t Ticket) SetHeader(h http.Header) {
	h.Set(TicketHeader, t.Nonce+" "+strconv.FormatInt(t.Expires.Unix(), 10))
}

// ParseTicket reads the ticket a forward carries; ok is false when it
// carries none or a malformed one.
func ParseTicket(v string) (Ticket, bool) {
	nonce, exp, ok := strings.Cut(v, " ")
	if !ok || nonce == "" || len(nonce) > 64 {
		return Ticket{}, false
	}
	sec, err := strconv.ParseInt(exp, 10, 64)
	if err != nil {
		return Ticket{}, false
	}
	return Ticket{Nonce: nonce, Expires: time.Unix(sec, 0)}, true
}

// IsAccessError reports whether err is one of this package's refusals.
func IsAccessError(err error) bool {
	return errors.Is(err, ErrInvalid) || errors.Is(err, ErrSpent)
}
