package broker

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/switchboard-relay/switchboard/internal/wire"
)

// Poll waits for a user request for device and hands it to the calling agent,
// identified by agentID (its credential's id; "" when agents are anonymous).
// It returns ErrPollTimeout after the poll wait, ErrDraining while the relay
// shuts down, or ctx's error when the agent goes away.
//
// The caller must write Exchange.Message to the agent; if that write fails it
// calls Requeue so that another poll gets the request.
//
// instance is the agent process's self-chosen id ("" when it sends none): when
// its polls stop because their connections dropped, the requests it took fail
// after AgentGoneGrace instead of waiting out the inactivity timeout.
func (b *Broker) Poll(ctx context.Context, device, agentID, instance string) (*Exchange, error) {
	b.mu.Lock()
	if b.draining {
		b.mu.Unlock()
		return nil, b.parkWhileDraining(ctx, instance)
	}
	d := b.deviceLocked(device)
	now := time.Now()
	seen, known := d.agents[instance]
	attached := !known || now.Sub(seen) >= b.cfg.PickupTimeout
	d.waiting++
	d.lastPoll = now
	if d.agents == nil {
		d.agents = map[string]time.Time{}
	}
	d.agents[instance] = now
	b.pollStartedLocked(instance, d.lastPoll)
	if d.release == nil {
		d.release = make(chan struct{})
	}
	release := d.release
	b.mu.Unlock()
	if attached && b.cfg.OnAttach != nil {
		b.cfg.OnAttach(device)
	}
	b.metrics.pollsWaiting.Inc()
	released := false // the device was forgotten here: the poll leaves no trace
	defer func() {
		b.mu.Lock()
		d.waiting--
		now := time.Now()
		if !released {
			d.lastPoll = now
			d.agents[instance] = now
		}
		b.pollEndedLocked(instance, now, ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrPollEnded))
		b.mu.Unlock()
		b.metrics.pollsWaiting.Dec()
	}()

	timer := time.NewTimer(b.cfg.PollWait)
	defer timer.Stop()
	for {
		select {
		case ex := <-d.queue:
			if b.take(ex, agentID, instance) {
				b.metrics.pending.Dec()
				return ex, nil
			}
			// The user gave up before any agent took it; look for the next one.
		case <-timer.C:
			return nil, ErrPollTimeout
		case <-release:
			released = true
			return nil, ErrPollTimeout
		case <-b.drainCh:
			return nil, ErrDraining
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), ErrPollEnded) {
				return nil, ErrPollEnded
			}
			return nil, ctx.Err()
		}
	}
}

// parkWhileDraining holds a poll that arrives during a drain until no request
// is in flight any more (or the poll wait passes), then ends it with
// ErrDraining. Agents poll again at once after a 408: answering at once would
// make every long-poll agent spin against the relay for the whole drain. The
// held poll also shows that its agent is alive, so that failGoneAgents leaves
// the requests it is still answering alone.
func (b *Broker) parkWhileDraining(ctx context.Context, instance string) error {
	b.mu.Lock()
	b.pollStartedLocked(instance, time.Now())
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.pollEndedLocked(instance, time.Now(), ctx.Err() != nil)
		b.mu.Unlock()
	}()
	timer := time.NewTimer(b.cfg.PollWait)
	defer timer.Stop()
	select {
	case <-b.idle:
	case <-b.closeCh:
	case <-timer.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return ErrDraining
}

// Requeue puts back a request that Poll returned but that could not be
// written to its agent, so that another poll gets it.
func (b *Broker) Requeue(ex *Exchange) {
	b.mu.Lock()
	if b.draining {
		b.mu.Unlock()
		ex.fail(drainingError()) // no poll will take it any more
		return
	}
	if !ex.state.CompareAndSwap(stateTaken, stateQueued) {
		b.mu.Unlock()
		return
	}
	b.untrackLocked(ex)
	d := b.devices[ex.Device]
	pushed := d != nil && b.pushLocked(d, ex)
	b.mu.Unlock()
	if pushed {
		b.metrics.pending.Inc()
		return
	}
	ex.state.Store(stateExpired)
	ex.fail(&Error{Status: http.StatusServiceUnavailable, Err: ErrNoAgent, RetryAfter: time.Second,
		Message: "the agent for device " + quote(ex.Device) + " went away before taking the request"})
}

// Deliver hands one response chunk from the agent agentID to the user waiting
// for it and returns once the user side has taken it (which paces the agent).
// It returns ErrUnknownRequest when the id is unknown or the user went away,
// and ErrNotYours when another agent credential took the request.
func (b *Broker) Deliver(ctx context.Context, agentID string, resp *wire.Response) error {
	ex, owner := b.lookup(resp.ID)
	if ex == nil {
		return ErrUnknownRequest
	}
	if owner != agentID {
		return ErrNotYours
	}
	select {
	case ex.chunks <- resp:
		return nil
	case <-ex.done:
		return ErrUnknownRequest
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NextUpstream returns the next bytes the user sent after a 101 upgrade of
// request id, at most BlockSize of them. It returns (nil, nil) when nothing
// arrived within the request stream wait, ErrStreamClosed once the user has
// closed its side, and ErrUnknownRequest for an unknown or finished id.
func (b *Broker) NextUpstream(ctx context.Context, agentID, id string) ([]byte, error) {
	ex, owner := b.lookup(id)
	if ex == nil {
		return nil, ErrUnknownRequest
	}
	if owner != agentID {
		return nil, ErrNotYours
	}
	timer := time.NewTimer(b.cfg.RequestStreamWait)
	defer timer.Stop()
	select {
	case p := <-ex.upstream:
		return p, nil
	case <-ex.upClosed:
		// Hand over what the user sent before closing, then report the close.
		select {
		case p := <-ex.upstream:
			return p, nil
		default:
			return nil, ErrStreamClosed
		}
	case <-ex.done:
		return nil, ErrUnknownRequest
	case <-timer.C:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// lookup returns the exchange with id and the agent that took it.
func (b *Broker) lookup(id string) (*Exchange, string) {
	if id == "" {
		return nil, ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ex := b.exchanges[id]
	if ex == nil {
		return nil, ""
	}
	return ex, ex.agentID
}

// Knows reports whether the request id is in flight on this broker.
func (b *Broker) Knows(id string) bool {
	ex, _ := b.lookup(id)
	return ex != nil
}
