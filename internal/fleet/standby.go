package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/ranking"
)

// SubjectPromote carries a holder's request that the relay keeping a
// device's standby tunnel promote it (a drain); every relay listens.
const SubjectPromote = "switchboard.fleet.promote"

// promoteMsg asks RelayID, which keeps a standby for Device, to promote
// it; By is the holder asking.
type promoteMsg struct {
	Device  string `json:"device"`
	RelayID string `json:"relay_id"`
	By      string `json:"by"`
}

// Entry returns device's directory entry as this relay's mirror holds it.
func (m *Member) Entry(device string) (Attachment, bool) {
	return m.devices.Get(deviceKey(device))
}

// Standby returns the relay a device held here should keep its standby
// tunnel at (ranking.Standby over the available relays, vetoed leaving
// some out); ok is false when no other relay is available.
func (m *Member) Standby(device, region string, vetoed func(id string) bool) (Target, bool) {
	v := m.view(time.Now())
	var cands []ranking.Relay
	var relays []Relay
	holder := -1
	for _, r := range m.relays.All() {
		st := v.state(r, vetoed, "")
		if r.ID == m.cfg.RelayID {
			holder = len(cands)
		}
		cands = append(cands, ranking.Relay{ID: r.ID, Region: r.Region, Available: st.Available(), Load: m.loads.of(r.ID), Capacity: r.MaxForward})
		relays = append(relays, r)
	}
	order := ranking.Rank(device, region, cands, make([]int, 0, len(cands)))
	i := ranking.Standby(holder, cands, order)
	if i < 0 || len(relays[i].Addresses) == 0 {
		return Target{}, false
	}
	return m.target(relays[i]), true
}

// Claim is a device this relay takes by promoting its standby tunnels
// of it, Agents of them.
type Claim struct {
	Device string
	Agents int
}

// ClaimPromoted records in the directory that this relay holds each
// claimed device, whose standby tunnels here it is about to promote: the
// move is written before any request goes there, and the old holder is
// asked to hand the device over. landed (if not nil) is called with the
// index of each claim whose write landed, before this relay's mirror and
// routing hold it: it promotes the tunnels, so that a request routed
// here by the new entry finds them. It returns each claim's error, in
// order; an error means that device did not move, and its standby must
// stay one. landed may run on several goroutines at once, for distinct
// claims.
//
// The claims' compare-and-sets go out together, pipelined on the store's
// connection, each from the revision this relay's mirror holds: a drain
// asks a standby relay for thousands of promotions at once, and one write
// at a time, each waiting for its answer, moved them at the pace of
// NATS's round trips. A claim whose write loses its compare-and-set (the
// mirror was behind) is written again on its own, from the entry read;
// one that fails otherwise is not, since it may yet land (see
// Config.OnRecordedHere).
func (m *Member) ClaimPromoted(ctx context.Context, claims []Claim, landed func(i int)) []error {
	errs := make([]error, len(claims))
	if landed == nil {
		landed = func(int) {}
	}
	type flight struct {
		i    int
		next Attachment
		from string
		ack  jetstream.PubAckFuture
	}
	var flights []flight
	var alone []int // claims written one by one
	js := m.st.JetStream()
	for i, c := range claims {
		key := deviceKey(c.Device)
		cur, rev := m.devices.Record(key)
		if rev == 0 || cur.RelayID == m.cfg.RelayID {
			alone = append(alone, i)
			continue
		}
		t := now()
		next := Attachment{Device: c.Device, RelayID: m.cfg.RelayID, AttachedAt: t, Agents: c.Agents, Protocol: "native", UpdatedAt: t}
		data, err := json.Marshal(next)
		if err != nil {
			errs[i] = err
			continue
		}
		ack, err := js.PublishMsgAsync(&nats.Msg{Subject: kvSubject(m.devsKV, key), Data: data}, jetstream.WithExpectLastSequencePerSubject(rev))
		if err != nil {
			alone = append(alone, i)
			continue
		}
		flights = append(flights, flight{i: i, next: next, from: cur.RelayID, ack: ack})
	}
	for _, f := range flights {
		c := claims[f.i]
		select {
		case pa := <-f.ack.Ok():
			landed(f.i)
			m.devices.Put(deviceKey(c.Device), f.next, pa.Sequence)
			m.noteAttached(c.Device, attachResult{entry: f.next, written: true, moved: true, from: f.from}, true)
		case err := <-f.ack.Err():
			if !isConflict(err) {
				// Not a lost compare-and-set: NATS did not take it (or
				// did not say), and writing again could land a second
				// move the relay learns nothing of.
				errs[f.i] = fmt.Errorf("attach %s: %w", c.Device, err)
				continue
			}
			alone = append(alone, f.i) // the mirror was behind: read, and decide again
		case <-ctx.Done():
			errs[f.i] = fmt.Errorf("attach %s: %w", c.Device, ctx.Err())
		}
	}
	// The few left, one by one in parallel as reconcile writes.
	sem := make(chan struct{}, reconcileParallel)
	var wg sync.WaitGroup
	for _, i := range alone {
		c := claims[i]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, errs[i] = m.attach(ctx, c.Device, Presence{Agents: c.Agents, Protocol: "native"}, true); errs[i] == nil {
				landed(i) // just after the mirror took it: a read decided this write
			}
		})
	}
	wg.Wait()
	return errs
}

// kvSubject is the subject a bucket's key is written on, as nats.go's
// key-value API writes it.
func kvSubject(kv jetstream.KeyValue, key string) string {
	return "$KV." + kv.Bucket() + "." + key
}

// AskPromote asks relay standby to promote its standby tunnel of device
// here, the device's holder. It does not wait; a relay that misses it
// keeps its standby, and the device's agent moves as a drain moves it.
func (m *Member) AskPromote(device, standby string) {
	data, err := json.Marshal(promoteMsg{Device: device, RelayID: standby, By: m.cfg.RelayID})
	if err == nil {
		err = m.st.Conn().Publish(SubjectPromote, data)
	}
	if err != nil {
		m.log.Debug("could not ask a relay to promote a standby", logkey.Device, device, logkey.RelayID, standby, logkey.Err, err)
	}
}

// subscribePromotes delivers promote requests meant for this relay to
// Config.OnPromote.
func (m *Member) subscribePromotes() (*nats.Subscription, error) {
	return m.st.Conn().Subscribe(SubjectPromote, func(msg *nats.Msg) {
		var p promoteMsg
		if err := json.Unmarshal(msg.Data, &p); err != nil || p.Device == "" || !ValidRelayID(p.By) {
			m.log.Warn("ignoring a malformed promote request", logkey.Err, err)
			return
		}
		if p.RelayID == m.cfg.RelayID {
			m.cfg.OnPromote(p.Device, p.By)
		}
	})
}

// reconcileStandbys records this relay in the directory as the standby of
// each device it keeps a standby tunnel for while another relay holds the
// device, and clears the mark of those it no longer keeps one for. The
// writes go out reconcileParallel at a time, as reconcile's do: a relay
// that joins a fleet of thousands of devices is named the standby of
// thousands at once.
func (m *Member) reconcileStandbys(ctx context.Context) error {
	kept := m.cfg.Standbys()
	m.mu.Lock()
	defer m.mu.Unlock()
	var marks, clears []string
	for dev := range kept {
		entry, ok := m.devices.Get(deviceKey(dev))
		if ok && entry.RelayID == m.cfg.RelayID && entry.Agents > 0 {
			// Only this relay's own promotion writes it here while it
			// keeps a standby (a relay that holds a device refuses its
			// standbys), and this one did not learn that its write landed.
			m.cfg.OnRecordedHere(dev)
			continue
		}
		if !ok || entry.RelayID == m.cfg.RelayID || entry.Standby == m.cfg.RelayID {
			continue
		}
		marks = append(marks, dev)
	}
	for dev := range m.standbys {
		if kept[dev] > 0 {
			continue
		}
		if entry, ok := m.devices.Get(deviceKey(dev)); !ok || entry.Standby != m.cfg.RelayID {
			// The mark is gone already (the device's promotion here or
			// another relay's attach dropped it). Only this relay names
			// itself standby, and its own writes enter the mirror as they
			// land, so the mirror is not behind the mark.
			delete(m.standbys, dev)
			continue
		}
		clears = append(clears, dev)
	}
	type result struct {
		dev string
		on  bool
		err error
	}
	results := make(chan result, len(marks)+len(clears))
	sem := make(chan struct{}, reconcileParallel)
	var wg sync.WaitGroup
	for i, dev := range slices.Concat(marks, clears) {
		on := i < len(marks)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results <- result{dev: dev, on: on, err: m.markStandby(ctx, dev, on)}
		})
	}
	wg.Wait()
	close(results)
	var errs []error
	for r := range results {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.on:
			m.standbys[r.dev] = true
		default:
			delete(m.standbys, r.dev)
		}
	}
	return errors.Join(errs...)
}

// markStandby sets (on) or clears this relay as device's standby, by
// compare-and-set: it is set only while another relay holds the device,
// and cleared only while it names this relay.
func (m *Member) markStandby(ctx context.Context, device string, on bool) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	self := m.cfg.RelayID
	_, err := updateFrom(ctx, m.devsKV, deviceKey(device), hint(m.devices, deviceKey(device)), func(cur Attachment, found bool) (Attachment, bool, error) {
		switch {
		case !found:
			return cur, false, nil
		case on && cur.RelayID != self && cur.Standby != self:
			cur.Standby = self
		case !on && cur.Standby == self:
			cur.Standby = ""
		default:
			return cur, false, nil
		}
		cur.UpdatedAt = now()
		return cur, true, nil
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("standby %s: %w", device, err)
	}
	return nil
}
