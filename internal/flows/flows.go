// Package flows carries UDP over streams. A flow is one source address's
// datagrams to one service and the service's answers: one stream, whose
// datagrams are framed with internal/datagram. A flow ends after Idle
// without a datagram either way; each holds at most Queue datagrams for
// its stream and drops the rest, as UDP may; a datagram over
// datagram.MaxSize is dropped where it is read from a socket, and logged.
//
//	user's side (a mapped port, switchboard connect --udp):
//	    s := &flows.Server{Conn: pc, Open: open}; s.Serve(ctx)
//	device's side (the agent, one connected UDP socket per stream):
//	    flows.Join(ctx, stream, udpConn, flows.Config{})
package flows

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/datagram"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/lograte"
)

// DefaultIdle is how long a flow lasts without a datagram either way.
const DefaultIdle = 60 * time.Second

// DefaultQueue is how many datagrams a flow holds for its stream before
// it drops new ones.
const DefaultQueue = 64

// ErrIdle ends a flow that saw no datagram either way for its idle time.
var ErrIdle = errors.New("the flow was idle")

// Config bounds a flow.
type Config struct {
	// Idle ends a flow without a datagram either way: DefaultIdle if zero.
	Idle time.Duration
	// Queue is how many datagrams wait for the stream: DefaultQueue if
	// zero.
	Queue int
	// Logger tells of dropped datagrams and of flows' ends; nil: nothing.
	Logger *slog.Logger
	// Lines bounds how often the flows log their starts, ends, refusals
	// and oversized datagrams, which sources a sender makes up can drive:
	// share one among the flows of a process. Nil: a Server makes one of
	// lograte.DefaultPerSecond; Join logs unbounded.
	Lines *lograte.Limiter
}

func (c Config) idle() time.Duration { return cmp.Or(c.Idle, DefaultIdle) }
func (c Config) queue() int          { return cmp.Or(c.Queue, DefaultQueue) }

// info logs an Info line within Lines' bound.
func (c Config) info(msg string, args ...any) {
	if c.Lines == nil {
		c.logger().Info(msg, args...)
		return
	}
	c.Lines.InfoTo(c.logger(), msg, args...)
}

// warn logs a Warn line within Lines' bound.
func (c Config) warn(msg string, args ...any) {
	if c.Lines == nil {
		c.logger().Warn(msg, args...)
		return
	}
	c.Lines.WarnTo(c.logger(), msg, args...)
}

func (c Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// flow is one flow's state, shared by its socket's reader and its stream.
type flow struct {
	in       chan []byte  // datagrams for the stream; full: dropped
	last     atomic.Int64 // when the last datagram went either way, as UnixNano
	dropped  atomic.Int64 // datagrams dropped: the queue was full
	oversize atomic.Int64 // datagrams dropped: over datagram.MaxSize
}

func newFlow(queue int) *flow {
	f := &flow{in: make(chan []byte, queue)}
	f.touch()
	return f
}

func (f *flow) touch() { f.last.Store(time.Now().UnixNano()) }

// offer queues a datagram read from the socket for the stream, or drops
// it: over the size a frame carries, or the stream is behind. It reports
// whether the datagram was the first oversized one of the flow.
func (f *flow) offer(d []byte) (firstOversize bool) {
	f.touch()
	if len(d) > datagram.MaxSize {
		return f.oversize.Add(1) == 1
	}
	select {
	case f.in <- append([]byte(nil), d...):
	default:
		f.dropped.Add(1)
	}
	return false
}

// carry runs f over st until the flow is idle, ctx ends or st fails: it
// writes the queued datagrams to st and hands st's datagrams to send. It
// closes st, and returns why the flow ended.
func (f *flow) carry(ctx context.Context, st net.Conn, send func([]byte) error, idle time.Duration) error {
	readErr := make(chan error, 1)
	go func() { readErr <- f.answer(st, send) }()
	stop := context.AfterFunc(ctx, func() { st.Close() }) // ends a write the stream holds up
	defer func() {
		stop()
		st.Close()
		<-readErr
	}()
	w := datagram.NewWriter(st)
	timer := time.NewTimer(idle)
	defer timer.Stop()
	for {
		select {
		case d := <-f.in:
			// A stream that takes nothing for the idle time ends the flow.
			st.SetWriteDeadline(time.Now().Add(idle))
			if _, err := w.Write(d); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return err
			}
		case <-timer.C:
			idleFor := time.Since(time.Unix(0, f.last.Load()))
			if idleFor >= idle {
				return ErrIdle
			}
			timer.Reset(idle - idleFor)
		case err := <-readErr:
			readErr <- err // for the deferred wait
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// answer reads st's datagrams and sends each, until st ends.
func (f *flow) answer(st net.Conn, send func([]byte) error) error {
	r := datagram.NewReader(st)
	buf := make([]byte, datagram.MaxSize)
	for {
		n, err := r.Read(buf)
		if err != nil {
			return err // buf holds MaxSize: a frame over it is ErrTooLarge
		}
		f.touch()
		if err := send(buf[:n]); err != nil {
			return fmt.Errorf("send a datagram of %d bytes: %w", n, err)
		}
	}
}

// logEnd tells why the flow ended and what it dropped.
func (f *flow) logEnd(cfg Config, err error, attrs ...any) {
	attrs = append(attrs, logkey.Cause, endCause(err), logkey.Dropped, f.dropped.Load(), logkey.Oversized, f.oversize.Load())
	if err == nil || errors.Is(err, ErrIdle) || errors.Is(err, context.Canceled) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
		cfg.info("flow ended", attrs...)
		return
	}
	cfg.warn("flow ended", append(attrs, logkey.Err, err)...)
}

func endCause(err error) string {
	switch {
	case errors.Is(err, ErrIdle):
		return "idle"
	case errors.Is(err, context.Canceled), errors.Is(err, net.ErrClosed):
		return "closed"
	case errors.Is(err, datagram.ErrTooLarge):
		return "oversized frame"
	case err == nil, errors.Is(err, io.EOF):
		return "stream ended"
	}
	return "stream failed"
}

// warnOversize tells, once per flow, of a datagram too large to carry.
func warnOversize(cfg Config, attrs ...any) {
	attrs = append(attrs, logkey.Limit, datagram.MaxSize)
	cfg.warn(fmt.Sprintf("datagram dropped: over the %d bytes a flow carries (further ones are counted at the flow's end)", datagram.MaxSize), attrs...)
}
