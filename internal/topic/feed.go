package topic

import (
	"context"
	"errors"
	"time"

	"github.com/switchboard-relay/switchboard/internal/backoff"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Link reaches the relay holding a topic's device.
type Link interface {
	// Subscribe reads the topic key from the relay holding its device,
	// handing each message to deliver, until ctx ends or the connection
	// breaks. It returns ErrLocal at once when this relay holds the
	// device. connected is called once the holder accepted.
	Subscribe(ctx context.Context, key Key, connected func(), deliver func(Message)) error
	// Publish opens a connection that sends messages to the topic key at
	// the relay holding its device, or returns ErrLocal when this relay
	// holds it.
	Publish(ctx context.Context, key Key) (Sender, error)
}

// Sender sends a writer's messages on to the relay holding the topic.
type Sender interface {
	// Send sends m whole; it waits while the holder's connection is full,
	// so that a writer faster than the link is slowed, not buffered.
	Send(ctx context.Context, m Message) error
	// Done is closed when the holder ended the connection.
	Done() <-chan struct{}
	// Err says why, once Done is closed.
	Err() error
	// Close ends the connection.
	Close() error
}

// startFeedLocked starts feeding t from its holder, unless a feed runs or
// the hub has no Link. t.mu is held.
func (t *Topic) startFeedLocked() {
	h := t.hub
	if h.cfg.Link == nil || t.stopFeed != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.stopFeed = cancel
	h.wg.Go(func() { t.feed(ctx) })
}

// feed copies the topic from the relay holding its device into this
// relay's topic, once for all of its readers here, reconnecting with
// back-off, until ctx ends (no user reads here any more) or this relay
// holds the device.
func (t *Topic) feed(ctx context.Context) {
	h := t.hub
	b := backoff.New(h.cfg.Retry)
	for {
		err := h.cfg.Link.Subscribe(ctx, t.key, func() { t.setFed(true); b.Up(h.cfg.Now()) }, t.publish)
		t.setFed(false)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrLocal) {
			return // held here: writers publish here, the stop of the feed happens on Moved
		}
		h.cfg.Logger.Debug("topic feed from the device's relay ended; retrying", logkey.Device, t.key.Device, logkey.Topic, t.key.Name, logkey.Err, err)
		wait := time.NewTimer(b.Next(h.cfg.Now()))
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return
		}
	}
}

func (t *Topic) setFed(fed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fed = fed
}
