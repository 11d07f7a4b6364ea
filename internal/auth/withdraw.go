package auth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/switchboard-relay/switchboard/internal/backoff"
	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// ErrUnavailable is wrapped by the error of a Create that failed because
// NATS cannot be reached: nothing was written.
var ErrUnavailable = errors.New("the token store cannot write to NATS (unreachable, or a cluster without its quorum)")

// withdrawTimeout bounds one attempt to delete a withdrawn token's key.
const withdrawTimeout = 5 * time.Second

// A create whose write fails may still have reached NATS: the publish left,
// and the answer was lost or came too late (a timeout, a connection cut
// after the write). Its caller was told that no token exists and never saw
// the secret, so the token must never become active. The store therefore
// withdraws the id: this relay hides it at once, and a loop deletes the key
// in the bucket, retrying until NATS answers.
//
// The delete leaves a marker under the key, and the create was a
// compare-and-set on "no message under this key yet". So whichever order
// NATS sees them in, the key ends deleted: a create that arrives after the
// marker is refused, one that arrived before is deleted by it. What is not
// covered is a relay that stops before the delete got through (logged on
// Close with the ids); such a token's secret is still known to nobody.

// withdraw hides id on this relay for good and queues the delete of its key.
func (s *Store) withdraw(id string) {
	s.mu.Lock()
	s.withdrawn[id] = struct{}{} // hides it even if the watch was faster than the error
	s.toDelete = append(s.toDelete, id)
	s.mu.Unlock()
	select {
	case s.deleteNow <- struct{}{}:
	default: // the loop is already asked
	}
}

// withdrawLoop deletes the keys of withdrawn tokens until Close.
func (s *Store) withdrawLoop() {
	b := backoff.New(backoff.Policy{Max: withdrawTimeout})
	var retry <-chan time.Time
	for {
		select {
		case <-s.ctx.Done():
			s.mu.Lock()
			left := s.toDelete
			s.mu.Unlock()
			if len(left) > 0 {
				s.log.Warn("closing with tokens whose creation failed still to be deleted in NATS; nobody knows their secrets, but revoke them to tidy the list", logkey.TokenIDs, left)
			}
			return
		case <-s.deleteNow:
		case <-retry:
		}
		retry = nil
		if !s.deletePending() {
			retry = time.After(b.Next(time.Now()))
		}
	}
}

// deletePending tries once to delete every queued key and reports whether
// none is left.
func (s *Store) deletePending() bool {
	s.mu.Lock()
	ids := s.toDelete
	s.toDelete = nil
	s.mu.Unlock()
	var left []string
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(s.ctx, withdrawTimeout)
		err := s.kv.Delete(ctx, id)
		cancel()
		if err != nil {
			left = append(left, id)
			s.log.Debug("deleting a token whose creation failed", attrTokenID, id, attrError, err)
			continue
		}
		s.log.Info("deleted a token whose creation had failed, in case it reached NATS", attrTokenID, id)
	}
	s.mu.Lock()
	s.toDelete = append(s.toDelete, left...)
	done := len(s.toDelete) == 0
	s.mu.Unlock()
	return done
}

// createError is the error of a Create whose write failed with err. A
// write that NATS did not confirm in time counts as NATS being away too: a
// cluster that lost its quorum takes the connection but confirms nothing.
func createError(err error) error {
	if store.Unavailable(err) {
		return fmt.Errorf("auth: create token: %w (%w); no token was created", ErrUnavailable, err)
	}
	return fmt.Errorf("auth: create token: %w; no token was created (should the write still reach NATS, the token is deleted)", err)
}
