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
	if in.waiting == 0 && len(in.exchanges) == 0 && !in.dropped {
		delete(b.instances, id)
	}
}

// failGoneAgents fails the requests in flight of agents whose last poll
// dropped more than AgentGoneGrace ago with no poll since.
func (b *Broker) failGoneAgents(now time.Time) {
	var doomed []*Exchange
	b.mu.Lock()
	for id, in := range b.instances {
		if in.waiting > 0 || now.Sub(in.lastSeen) < b.cfg.AgentGoneGrace {
			continue
		}
		if in.dropped {
			for ex := range in.exchanges {
				doomed = append(doomed, ex)
			}
		}
		if in.dropped || len(in.exchanges) == 0 {
			delete(b.instances, id)
		}
	}
	b.mu.Unlock()
	for _, ex := range doomed {
		ex.fail(fmt.Errorf("the agent for device %q went away mid-response: %w", ex.Device, io.ErrUnexpectedEOF))
	}
}
