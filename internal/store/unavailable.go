package store

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Unavailable reports whether err says that NATS could not take or confirm
// a read or a write: the connection is down or being replaced, nothing
// answers for the stream (no server, or a cluster electing a leader or
// without its quorum), or the answer did not come in time. Such an
// operation may be tried again once NATS is back; any other error will not
// mend by waiting.
func Unavailable(err error) bool {
	return errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded)
}
