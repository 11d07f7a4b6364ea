package broker

import (
	"fmt"
	"io"
	"time"
)

// instance is one agent process that names itself on every call, so that the
// broker can tell when it is gone: its polls stop and their connections drop.
// Guarded by Broker.mu.
type instance struct {
	waiting   int                    // polls waiting right now
	lastSeen  time.Time              // when a poll last started or ended
	dropped   bool                   // the last poll ended because its connection went away
	exchanges map[*Exchange]struct{} // requests it took and has not finished
}

// pollStartedLocked records a poll of instance id.
func (b *Broker) pollStartedLocked(id string, now time.Time) {
	if id == "" {
		return
	}
	in := b.instances[id]
	if in == nil {
		in = &instance{exchanges: make(map[*Exchange]struct{})}
		b.instances[id] = in
	}
	in.waiting++
	in.lastSeen = now
	in.dropped = false
}

// pollEndedLocked records the end of a poll of instance id; dropped tells
// whether the agent's connection went away.
func (b *Broker) pollEndedLocked(id string, now time.Time, dropped bool) {
	in := b.instances[id]
	if in == nil {
		return
	}
	in.waiting--
	in.lastSeen = now
	in.dropped = dropped && in.waiting == 0
	if in.waiting == 0 && len(in.exchanges) == 0 {
		delete(b.instances, id)
	}
}

// silentFactor stretches the grace for an agent whose last poll ended
// normally: a live agent polls again at once, but a loaded one may be late.
const silentFactor = 5

// failGoneAgents fails the requests in flight of agents that stopped
// polling: AgentGoneGrace after their last poll's connection dropped, or
// silentFactor times that after a poll that ended normally.
func (b *Broker) failGoneAgents(now time.Time) {
	var doomed []*Exchange
	b.mu.Lock()
	for id, in := range b.instances {
		grace := b.cfg.AgentGoneGrace
		if !in.dropped {
			grace *= silentFactor
		}
		if in.waiting > 0 || now.Sub(in.lastSeen) < grace {
			continue
		}
		for ex := range in.exchanges {
			doomed = append(doomed, ex)
		}
		delete(b.instances, id)
	}
	b.mu.Unlock()
	for _, ex := range doomed {
		ex.fail(fmt.Errorf("the agent for device %q went away mid-response: %w", ex.Device, io.ErrUnexpectedEOF))
	}
}
