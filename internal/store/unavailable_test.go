package store

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestUnavailable(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{nats.ErrConnectionReconnecting, true},
		{fmt.Errorf("put: %w", jetstream.ErrNoStreamResponse), true},
		{nats.ErrNoResponders, true},
		{nats.ErrTimeout, true},
		{fmt.Errorf("create: %w", context.DeadlineExceeded), true},
		{jetstream.ErrKeyExists, false},
		{jetstream.ErrKeyNotFound, false},
		{errors.New("bad record"), false},
		{nil, false},
	} {
		if got := Unavailable(tt.err); got != tt.want {
			t.Errorf("Unavailable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
