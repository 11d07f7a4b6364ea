// Package broker matches user requests with long-poll agents on one relay.
//
// For every device name it keeps the user requests waiting for an agent (a
// bounded queue) and the agents' polls waiting for a request; each request is
// handed to exactly one poll. It then carries the agent's response chunks back
// to the user, and after a 101 upgrade the user's bytes to the agent.
//
// The user side is an http.RoundTripper (the device is the request URL's host),
// so the relay puts the broker under httputil.ReverseProxy. The agent side is a
// Go API (Poll, Deliver, NextUpstream) that the long-poll HTTP handlers call.
// The broker knows nothing of HTTP routing, authentication or listeners.
package broker

import (
	"context"
	"sync"
	"time"
)

// Broker matches user requests with agents' polls. Create it with New, stop it
// with Close.
type Broker struct {
	cfg     Config
	metrics *metrics
	drainCh chan struct{} // closed by Drain
	closeCh chan struct{} // closed by Close
	wg      sync.WaitGroup

	mu        sync.Mutex // guards the fields below
	devices   map[string]*device
	exchanges map[string]*Exchange // by request id, from enqueue until the user side finishes
	instances map[string]*instance // agent processes that name themselves, by instance id
	draining  bool
	closed    bool
	idle      chan struct{} // closed when draining and no exchange is left
}

// device is the broker's record of one device name.
type device struct {
	name  string
	queue chan *Exchange // user requests not yet handed to an agent

	// Guarded by Broker.mu:
	waiting  int                  // polls waiting right now
	lastPoll time.Time            // when a poll last started or ended
	agents   map[string]time.Time // agent instance ("" if unnamed) → its last poll
	release  chan struct{}        // closed to end the polls waiting now; nil until needed
}

// New returns a running broker. Call Close to stop it.
func New(cfg Config) (*Broker, error) {
	cfg.Complete()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Broker{
		cfg:       cfg,
		metrics:   newMetrics(cfg.Metrics),
		drainCh:   make(chan struct{}),
		closeCh:   make(chan struct{}),
		devices:   make(map[string]*device),
		exchanges: make(map[string]*Exchange),
		instances: make(map[string]*instance),
		idle:      make(chan struct{}),
	}
	b.wg.Add(1)
	go b.sweep()
	return b, nil
}

// Config returns the broker's completed configuration.
func (b *Broker) Config() Config { return b.cfg }

// Drain stops handing requests to agents: waiting and new polls end with
// ErrDraining, queued requests fail with 503, new user requests are refused.
// Requests already taken by an agent run to completion; Wait waits for them.
func (b *Broker) Drain() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.draining {
		return
	}
	b.draining = true
	close(b.drainCh)
	b.checkIdleLocked()
}

// Wait returns when every request in flight has finished after Drain, or with
// ctx's error when ctx ends first.
func (b *Broker) Wait(ctx context.Context) error {
	select {
	case <-b.idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close aborts every request in flight and stops the broker. It is safe to
// call more than once.
func (b *Broker) Close() {
	b.Drain()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.closeCh)
	exs := make([]*Exchange, 0, len(b.exchanges))
	for _, ex := range b.exchanges {
		exs = append(exs, ex)
	}
	b.mu.Unlock()
	for _, ex := range exs {
		ex.finish()
	}
	b.wg.Wait()
}

// Devices reports the device names with an agent seen within the inactive
// backend timeout.
func (b *Broker) Devices() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var names []string
	for name, d := range b.devices {
		if b.connectedLocked(d, now, b.cfg.InactiveBackendTimeout) {
			names = append(names, name)
		}
	}
	return names
}

// Presence counts, per device with a long-poll agent now, its agent
// instances: those with a poll waiting or one that ended within the pickup
// timeout (agents that send no instance id count as one).
func (b *Broker) Presence() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	window := b.cfg.PickupTimeout
	out := map[string]int{}
	for name, d := range b.devices {
		if !b.connectedLocked(d, now, window) {
			continue
		}
		n := 0
		for id, seen := range d.agents {
			if in := b.instances[id]; now.Sub(seen) < window || id != "" && in != nil && in.waiting > 0 {
				n++
			}
		}
		out[name] = max(n, 1)
	}
	return out
}

// connectedLocked reports whether d has a poll waiting or had one within window.
func (b *Broker) connectedLocked(d *device, now time.Time, window time.Duration) bool {
	return d.waiting > 0 || now.Sub(d.lastPoll) < window
}

// deviceLocked returns the record of name, creating it.
func (b *Broker) deviceLocked(name string) *device {
	d := b.devices[name]
	if d == nil {
		d = &device{name: name, queue: make(chan *Exchange, b.cfg.MaxPendingPerDevice)}
		b.devices[name] = d
		b.metrics.devices.Set(float64(len(b.devices)))
	}
	return d
}

// checkIdleLocked closes idle once draining and nothing is in flight.
func (b *Broker) checkIdleLocked() {
	if b.draining && len(b.exchanges) == 0 {
		select {
		case <-b.idle:
		default:
			close(b.idle)
		}
	}
}

// sweep fails the requests of agents that went away and forgets devices
// whose agents have been gone for the inactive backend timeout, so that the
// tables do not grow without bound.
func (b *Broker) sweep() {
	defer b.wg.Done()
	every := min(b.cfg.InactiveBackendTimeout/2, time.Minute)
	forget := time.NewTicker(every)
	defer forget.Stop()
	gone := time.NewTicker(b.cfg.AgentGoneGrace / 2)
	defer gone.Stop()
	for {
		select {
		case <-b.closeCh:
			return
		case now := <-gone.C:
			b.failGoneAgents(now)
		case now := <-forget.C:
			b.forgetIdle(now)
		}
	}
}

func (b *Broker) forgetIdle(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for name, d := range b.devices {
		for id, seen := range d.agents {
			if now.Sub(seen) >= b.cfg.InactiveBackendTimeout {
				delete(d.agents, id)
			}
		}
		if b.connectedLocked(d, now, b.cfg.InactiveBackendTimeout) {
			continue
		}
		b.purgeExpiredLocked(d)
		if len(d.queue) == 0 {
			delete(b.devices, name)
		}
	}
	b.metrics.devices.Set(float64(len(b.devices)))
}

// CancelDevice fails every request for device, queued or in flight through
// its long-poll agents, with err, and forgets the device's agents, so that it
// counts as detached until an agent polls again.
func (b *Broker) CancelDevice(device string, err error) int {
	b.mu.Lock()
	var doomed []*Exchange
	for _, ex := range b.exchanges {
		if ex.Device == device {
			doomed = append(doomed, ex)
		}
	}
	b.forgetLocked(device)
	b.mu.Unlock()
	for _, ex := range doomed {
		ex.fail(err)
	}
	return len(doomed)
}

// FailAgent fails, with err, every request that the agent credential
// agentID took and has not finished answering: the credential was revoked,
// and the agent's next answer would be refused. It returns how many.
func (b *Broker) FailAgent(agentID string, err error) int {
	if agentID == "" {
		return 0
	}
	b.mu.Lock()
	var doomed []*Exchange
	for _, ex := range b.exchanges {
		if ex.state.Load() == stateTaken && ex.agentID == agentID {
			doomed = append(doomed, ex)
		}
	}
	b.mu.Unlock()
	for _, ex := range doomed {
		ex.fail(err)
	}
	return len(doomed)
}

// ForgetDevice ends the polls waiting for device (answered 408, so that
// their agents poll again at once, wherever they are routed now) and
// forgets its agents, so that it counts as detached here. Requests in
// flight run on. For a device that moved to another relay.
func (b *Broker) ForgetDevice(device string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forgetLocked(device)
}

func (b *Broker) forgetLocked(device string) {
	d := b.devices[device]
	if d == nil {
		return
	}
	clear(d.agents)
	d.lastPoll = time.Time{}
	if d.release != nil {
		close(d.release)
		d.release = nil
	}
	// Requests no agent took yet go back to their routers, which send them
	// where the device is now.
	for {
		select {
		case ex := <-d.queue:
			if ex.expire() {
				ex.fail(movedError(device))
			}
			continue
		default:
		}
		break
	}
}

// HasAgent reports whether device has a long-poll agent now: a poll waiting,
// or one that ended within the pickup timeout.
func (b *Broker) HasAgent(device string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.devices[device]
	return !b.draining && d != nil && b.connectedLocked(d, time.Now(), b.cfg.PickupTimeout)
}

func (b *Broker) isDraining() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.draining
}

// Remembers reports whether device had a long-poll agent within the
// inactive backend timeout: a request for it waits a grace for the agent.
func (b *Broker) Remembers(device string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.devices[device]
	return d != nil && b.connectedLocked(d, time.Now(), b.cfg.InactiveBackendTimeout)
}
