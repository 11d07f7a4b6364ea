package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Limits of the event log.
const (
	eventsMaxAge  = 7 * 24 * time.Hour // events older than this are dropped
	eventsMaxMsgs = 100_000            // and beyond this many, the oldest
	// eventQueueSize bounds the events waiting to be published: a
	// standby relay promoting a drain's devices writes two batches of
	// 1,024 moves in a few hundred ms (node's promoter), whose events
	// must all fit while the first are published.
	eventQueueSize = 4096
	// eventBatch is the most queued events published at once, each
	// waiting for its acknowledgment alongside the others: a drain of
	// thousands of devices records thousands of moves within seconds,
	// more than one publish at a time keeps up with (128 at once fell
	// behind a drain's batched promotions, 3,000–5,000 moves a second).
	eventBatch = 1024
	// MaxEventsList is the most events one List returns.
	MaxEventsList = 1000
)

// eventsConfig is the stream that holds the event log.
func eventsConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:      StreamEvents,
		Subjects:  []string{SubjectEvents + ">"},
		MaxAge:    eventsMaxAge,
		MaxMsgs:   eventsMaxMsgs,
		Discard:   jetstream.DiscardOld,
		Retention: jetstream.LimitsPolicy,
	}
}

// eventLog publishes events in order from a queue, so that callers never wait
// for NATS; while NATS is unreachable it holds the queue and retries, and
// drops (and counts) events only when the queue is full.
type eventLog struct {
	js      jetstream.JetStream
	stream  jetstream.Stream
	log     *slog.Logger
	queue   chan Event
	dropped atomic.Int64
}

func newEventLog(js jetstream.JetStream, st jetstream.Stream, log *slog.Logger) *eventLog {
	return &eventLog{js: js, stream: st, log: log, queue: make(chan Event, eventQueueSize)}
}

// add queues e for publishing.
func (l *eventLog) add(e Event) {
	if e.Time.IsZero() {
		e.Time = now()
	}
	select {
	case l.queue <- e:
	default:
		if l.dropped.Add(1) == 1 {
			l.log.Warn("event queue full; dropping events until NATS takes them again", logkey.Type, e.Type)
		}
	}
}

// run publishes queued events until ctx ends: what waits in the queue,
// up to eventBatch at once; then one by one, every second until NATS
// takes each, those it did not acknowledge.
func (l *eventLog) run(ctx context.Context) {
	batch := make([]Event, 0, eventBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-l.queue:
			batch = append(batch[:0], e)
		}
	more:
		for len(batch) < eventBatch {
			select {
			case e := <-l.queue:
				batch = append(batch, e)
			default:
				break more
			}
		}
		for _, e := range l.publishBatch(ctx, batch) {
			for {
				err := l.publish(ctx, e)
				if err == nil || ctx.Err() != nil {
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		}
	}
}

// publishBatch publishes events without waiting for each acknowledgment
// before the next, and returns, in order, those NATS did not acknowledge
// within 2 s.
func (l *eventLog) publishBatch(ctx context.Context, events []Event) []Event {
	if len(events) == 1 {
		if l.publish(ctx, events[0]) == nil {
			return nil
		}
		return events
	}
	futures := make([]jetstream.PubAckFuture, len(events))
	for i, e := range events {
		data, err := json.Marshal(e)
		if err != nil {
			continue // cannot happen for Event
		}
		if f, err := l.js.PublishAsync(SubjectEvents+e.Type, data); err == nil {
			futures[i] = f
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var failed []Event
	for i, f := range futures {
		if f == nil {
			failed = append(failed, events[i])
			continue
		}
		select {
		case <-f.Ok():
		case <-f.Err():
			failed = append(failed, events[i])
		case <-wctx.Done():
			failed = append(failed, events[i])
		}
	}
	return failed
}

func (l *eventLog) publish(ctx context.Context, e Event) error {
	data, err := json.Marshal(e)
	if err != nil {
		return nil // cannot happen for Event; nothing to retry
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = l.js.Publish(pctx, SubjectEvents+e.Type, data)
	return err
}

// list returns the last n events, oldest first.
func (l *eventLog) list(ctx context.Context, n int) ([]Event, error) {
	if n <= 0 || n > MaxEventsList {
		n = MaxEventsList
	}
	info, err := l.stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the event log: %w", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if info.State.Msgs == 0 {
		return []Event{}, nil
	}
	start := first
	if last >= uint64(n) && last-uint64(n)+1 > first {
		start = last - uint64(n) + 1
	}
	cons, err := l.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   start,
	})
	if err != nil {
		return nil, fmt.Errorf("reading the event log: %w", err)
	}
	want := int(min(uint64(n), last-start+1)) // what the stream holds: no waiting for more
	out := make([]Event, 0, want)
	for len(out) < want {
		batch, err := cons.Fetch(want-len(out), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("reading the event log: %w", err)
		}
		got := 0
		var seq uint64
		for msg := range batch.Messages() {
			got++
			e, s := decodeEvent(msg)
			seq = s
			out = append(out, e)
		}
		if batch.Error() != nil || got == 0 || seq >= last {
			break
		}
	}
	return out, nil
}

// follow calls fn with each event published after the call, until ctx ends
// or fn fails.
func (l *eventLog) follow(ctx context.Context, fn func(Event) error) error {
	cons, err := l.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return fmt.Errorf("following the event log: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("following the event log: %w", err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			return ctx.Err()
		}
		e, _ := decodeEvent(msg)
		if err := fn(e); err != nil {
			return err
		}
	}
}

// decodeEvent decodes a stream message into an Event with its sequence.
func decodeEvent(msg jetstream.Msg) (Event, uint64) {
	var e Event
	if err := json.Unmarshal(msg.Data(), &e); err != nil {
		e = Event{Type: "malformed", Message: "an unreadable event: " + err.Error()}
	}
	if md, err := msg.Metadata(); err == nil {
		e.Seq = md.Sequence.Stream
	}
	return e, e.Seq
}
