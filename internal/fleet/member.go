package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/kvmirror"
	"github.com/switchboard-relay/switchboard/internal/store"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// opTimeout bounds one NATS operation of the background loops, so that an
// unreachable NATS delays a beat rather than stopping the loop.
const opTimeout = 2 * time.Second

// Member is one relay's part in the fleet state: it enrols and beats,
// publishes the devices the relay holds, mirrors the relay set and the
// device directory, and does housekeeping while it holds the lease. Its
// read methods answer from memory and keep answering, from what they last
// knew, while NATS is unreachable.
type Member struct {
	cfg      Config
	log      *slog.Logger
	st       *store.Store
	relaysKV jetstream.KeyValue
	devsKV   jetstream.KeyValue
	leaseKV  jetstream.KeyValue
	fleetKV  jetstream.KeyValue
	relays   *kvmirror.Mirror[Relay]
	devices  *kvmirror.Mirror[Attachment]
	events   *eventLog

	loads       relayLoads    // devices attached per relay, from the directory
	kick        chan struct{} // asks for a reconcile of the attachments
	beatNow     chan struct{} // asks for a heartbeat now
	started     time.Time     // when this member opened: the relay's start
	cancelSub   *nats.Subscription
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	closeOnce   sync.Once
	shouldDrain atomic.Bool
	leaseHeld   atomic.Bool
	stopping    atomic.Bool // the shutdown was announced
	reachable   atomic.Bool
	frozen      atomic.Pointer[freeze] // the relay set's last freeze that ended; see view

	mu          sync.Mutex           // guards published; held by the reconcile loop
	published   map[string]Presence  // what this relay last wrote per device
	movedAway   map[string]bool      // devices another relay took while agents remained here
	wroteAt     map[string]time.Time // the updated_at of this relay's last write per device
	lostSince   map[string]time.Time // when an arriving agent lost its previous relay
	standbys    map[string]bool      // devices this relay recorded itself the standby of
	heldStandby map[string]string    // the standby relay last recorded for each device held here
	promoteSub  *nats.Subscription
	takenSub    *nats.Subscription
	lostMu      sync.Mutex           // guards lostSince, apart from mu: handshakes note into it
	sentMu      sync.Mutex           // guards sent, apart from mu: handshakes and Route use it
	sent        map[string]sentAgent // devices whose agents went from here to another relay (sent.go)
	hk          housekeeping         // used by the lease holder's loop only
}

// Open opens the fleet state in st for the relay cfg describes and starts the
// member's loops; it returns once the mirrors hold the whole relay set and
// directory and the first heartbeat is written. Close stops it.
func Open(ctx context.Context, st *store.Store, cfg Config) (*Member, error) {
	cfg.Complete()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Member{
		cfg:         cfg,
		log:         cfg.Logger.With(logkey.Component, "fleet", logkey.RelayID, cfg.RelayID),
		st:          st,
		kick:        make(chan struct{}, 1),
		beatNow:     make(chan struct{}, 1),
		started:     now(),
		published:   map[string]Presence{},
		movedAway:   map[string]bool{},
		wroteAt:     map[string]time.Time{},
		lostSince:   map[string]time.Time{},
		standbys:    map[string]bool{},
		heldStandby: map[string]string{},
		sent:        map[string]sentAgent{},
	}
	s, err := ensureState(ctx, st)
	if err != nil {
		return nil, err
	}
	m.relaysKV, m.devsKV, m.leaseKV, m.fleetKV = s.relays, s.devices, s.leases, s.fleet
	stream := s.events
	m.events = newEventLog(st.JetStream(), stream, m.log)
	m.relays = kvmirror.New(m.relaysKV, m.log, kvmirror.Config[Relay]{
		OnChange: func() {
			cfg.Secret.RelaysChanged()
			cfg.OnChange()
		},
		// An operator's drain (or undrain) of this relay takes effect at
		// once, not at the next heartbeat: the beat that applies it is
		// sent now.
		OnApply: func(old, nw *Relay) {
			m.noteOwnBeat(old, nw)
			if nw != nil && nw.ID == m.cfg.RelayID && nw.Draining != m.shouldDrain.Load() {
				m.BeatNow()
			}
		},
		// After a gap in the watch the own beat comes back in a full read.
		OnReload: func(old, items map[string]Relay) {
			if prev, ok := old[m.cfg.RelayID]; ok {
				if next, ok := items[m.cfg.RelayID]; ok {
					m.noteOwnBeat(&prev, &next)
				}
			}
		},
	})
	m.devices = kvmirror.New(m.devsKV, m.log, kvmirror.Config[Attachment]{
		Decode: decodeAttachment,
		OnChange: func() {
			m.Changed()
			cfg.OnChange()
		},
		OnReload: func(_, items map[string]Attachment) { m.loads.reload(items) },
		OnApply:  m.loads.apply,
	})

	runCtx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.wg.Go(func() { m.relays.Run(runCtx) })
	m.wg.Go(func() { m.devices.Run(runCtx) })
	m.wg.Go(func() { m.events.run(runCtx) })
	st.OnReconnect(func() {
		m.relays.Resync()
		m.devices.Resync()
		cfg.Secret.Resync()
		m.Changed()
	})

	sub, err := m.subscribeCancels()
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("listening for cancel requests: %w", err)
	}
	m.cancelSub = sub
	if m.promoteSub, err = m.subscribePromotes(); err != nil {
		m.Close()
		return nil, fmt.Errorf("listening for promote requests: %w", err)
	}
	if m.takenSub, err = m.subscribeTaken(); err != nil {
		m.Close()
		return nil, fmt.Errorf("listening for agents taken: %w", err)
	}
	if err := m.waitSynced(ctx); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.beat(ctx); err != nil {
		m.Close()
		return nil, fmt.Errorf("first heartbeat: %w", err)
	}
	m.reachable.Store(true)
	cfg.Secret.RelaysChanged()
	m.wg.Go(func() { m.beatLoop(runCtx) })
	m.wg.Go(func() { m.reconcileLoop(runCtx) })
	m.wg.Go(func() { m.housekeepingLoop(runCtx) })
	return m, nil
}

// state is the handles of the fleet's buckets and stream.
type state struct {
	relays, devices, leases, fleet jetstream.KeyValue
	events                         jetstream.Stream
}

// ensureState creates the buckets and the event stream, or checks that they
// exist: at start, and again when a beat fails, since a NATS server that
// came back without its files has none of them.
func ensureState(ctx context.Context, st *store.Store) (state, error) {
	var s state
	var err error
	if s.relays, err = st.KeyValue(ctx, BucketRelays); err != nil {
		return s, err
	}
	if s.devices, err = st.KeyValue(ctx, BucketDevices); err != nil {
		return s, err
	}
	if s.leases, err = st.KeyValue(ctx, BucketLeases); err != nil {
		return s, err
	}
	if s.fleet, err = st.KeyValue(ctx, BucketFleet); err != nil {
		return s, err
	}
	s.events, err = st.Stream(ctx, eventsConfig())
	return s, err
}

// waitSynced waits until the mirrors completed their first full read.
func (m *Member) waitSynced(ctx context.Context) error {
	for _, ready := range []<-chan struct{}{m.relays.Ready(), m.devices.Ready()} {
		select {
		case <-ready:
		case <-ctx.Done():
			return fmt.Errorf("reading the fleet state: %w", ctx.Err())
		}
	}
	return nil
}

// Close stops the loops, gives the housekeeping lease up and marks nothing
// else: the relay's record stays, and goes stale when its beats stop.
func (m *Member) Close() error {
	m.closeOnce.Do(func() {
		if m.cancelSub != nil {
			_ = m.cancelSub.Unsubscribe()
		}
		if m.promoteSub != nil {
			_ = m.promoteSub.Unsubscribe()
		}
		if m.takenSub != nil {
			_ = m.takenSub.Unsubscribe()
		}
		m.cancel()
		m.wg.Wait()
		if m.leaseHeld.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			_ = releaseLease(ctx, m.leaseKV, leaseHousekeeping, m.cfg.RelayID)
		}
	})
	return nil
}

// Abandon stops the member's loops the way a crash would: the lease is not
// released and nothing more is written, so the fleet sees the relay go
// stale and another relay take the lease only when it expires. For failover
// tests; a relay that stops on purpose calls Close.
func (m *Member) Abandon() {
	m.cancel()
	m.wg.Wait()
	m.leaseHeld.Store(false)
}

// ID returns this relay's id.
func (m *Member) ID() string { return m.cfg.RelayID }

// ShouldDrain reports the stored drain flag as of the last heartbeat.
func (m *Member) ShouldDrain() bool { return m.shouldDrain.Load() }

// LeaseHeld reports whether this relay runs housekeeping now.
func (m *Member) LeaseHeld() bool { return m.leaseHeld.Load() }

// Changed tells the member that the relay's devices changed, so that it
// publishes them soon. It never blocks.
func (m *Member) Changed() { nudge(m.kick) }

// NoteLost records that an agent of device arriving now lost its previous
// relay lostFor ago, so that the device's move, once written, carries how
// long it took from the loss to the agent's arrival here.
func (m *Member) NoteLost(device string, lostFor time.Duration) {
	if lostFor < 0 || lostFor > time.Minute {
		return
	}
	m.lostMu.Lock()
	defer m.lostMu.Unlock()
	if len(m.lostSince) < 100_000 {
		m.lostSince[device] = time.Now().Add(-lostFor)
	}
}

// BeatNow asks for a heartbeat at once, to announce a change such as a
// shutdown without waiting for the next interval. It never blocks.
func (m *Member) BeatNow() { nudge(m.beatNow) }

// Record adds an event to the fleet's event log.
func (m *Member) Record(e Event) {
	e.By = m.cfg.RelayID
	m.events.add(e)
}

// RecordNow publishes e at once, past the queue, and returns when NATS has
// it or ctx ends: for what a relay tells as it stops, which the queue
// would not outlive.
func (m *Member) RecordNow(ctx context.Context, e Event) error {
	e.By = m.cfg.RelayID
	if e.Time.IsZero() {
		e.Time = now()
	}
	return m.events.publish(ctx, e)
}

// nudge asks the loop that reads ch, a channel of one slot, to run now. It
// never blocks: a nudge already waiting is enough.
func nudge(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// everyBeat calls f every beat interval and whenever kick receives, until
// ctx ends.
func (m *Member) everyBeat(ctx context.Context, kick <-chan struct{}, f func(context.Context)) {
	t := time.NewTicker(m.cfg.BeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		f(ctx)
	}
}

func (m *Member) beatLoop(ctx context.Context) { m.everyBeat(ctx, m.beatNow, m.beatOnce) }

// beatOnce writes one heartbeat, recreating the buckets if NATS answers but
// the heartbeat fails, and notes when the fleet state becomes unreachable
// or reachable again.
func (m *Member) beatOnce(ctx context.Context) {
	err := m.beat(ctx)
	if err != nil && ctx.Err() == nil && m.st.Connected() {
		// NATS answers, but the beat failed: the buckets may be gone.
		ectx, cancel := context.WithTimeout(ctx, opTimeout)
		if _, eerr := ensureState(ectx, m.st); eerr == nil {
			err = m.beat(ctx)
		}
		cancel()
	}
	switch {
	case err == nil && !m.reachable.Swap(true):
		m.log.Info("fleet state reachable again; heartbeat and attachments re-published")
		m.relays.Resync()
		m.devices.Resync()
		m.cfg.Secret.Resync()
		m.Changed()
	case err != nil && ctx.Err() == nil && m.reachable.Swap(false):
		m.log.Warn("fleet state unreachable; serving what this relay already knows", logkey.Err, err)
	}
}

// beat writes one heartbeat and applies its answer.
func (m *Member) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	local := m.cfg.Local
	stopping := local.Stopping()
	fp, accepted, source := m.cfg.Secret.Report()
	ans, err := beat(ctx, m.relaysKV, m.cfg.RelayID, Report{
		Hostname: m.cfg.Hostname, Region: m.cfg.Region, Addresses: m.cfg.Addresses,
		Version: m.cfg.Version, Healthy: local.Healthy(), Stopping: stopping,
		ForwardSessions: len(local.Presence()), MaxForward: m.cfg.MaxForward,
		AgentSessions: local.AgentSessions(), StartedAt: m.started,
		SecretFingerprint: fp, SecretAccepted: accepted, SecretSource: source,
	}, m.cfg.BeatInterval)
	if err != nil {
		return err
	}
	if ans.Enrolled {
		m.Record(Event{Type: EventRelayEnrolled, RelayID: m.cfg.RelayID,
			Message: fmt.Sprintf("relay %s enrolled (%s, region %q, version %s)", m.cfg.RelayID, m.cfg.Hostname, m.cfg.Region, m.cfg.Version)})
		m.log.Info("relay enrolled in the fleet")
	}
	if stopping && !m.stopping.Swap(true) {
		m.Record(Event{Type: EventRelayStopping, RelayID: m.cfg.RelayID, Message: fmt.Sprintf("relay %s is shutting down", m.cfg.RelayID)})
	}
	if old := m.shouldDrain.Swap(ans.ShouldDrain); old != ans.ShouldDrain {
		if ans.ShouldDrain {
			m.log.Info("this relay is marked draining: it takes no new devices")
		} else {
			m.log.Info("this relay is no longer draining")
		}
		m.cfg.OnShouldDrain(ans.ShouldDrain)
	}
	return nil
}

func (m *Member) reconcileLoop(ctx context.Context) {
	m.everyBeat(ctx, m.kick, func(ctx context.Context) {
		if err := m.reconcile(ctx); err != nil && ctx.Err() == nil {
			m.log.Debug("publishing attachments", logkey.Err, err)
		}
		if err := m.reconcileStandbys(ctx); err != nil && ctx.Err() == nil {
			m.log.Debug("publishing standbys", logkey.Err, err)
		}
		m.forgetSent()
	})
}

// reconcile writes the changes between what the relay holds and what it
// last published, and re-publishes any of its devices the directory lost
// (a NATS restart without its files). It does not fight another relay for a
// device whose presence here has not changed: moving devices is routing's
// decision, not a race between heartbeats.
func (m *Member) reconcile(ctx context.Context) error {
	local := m.cfg.Local.Presence()
	m.mu.Lock()
	defer m.mu.Unlock()
	var attaches, detaches []string
	for dev, p := range local {
		pub, published := m.published[dev]
		entry, inDir := m.devices.Get(deviceKey(dev))
		if inDir && entry.RelayID == m.cfg.RelayID && entry.Standby != "" {
			m.heldStandby[dev] = entry.Standby
		}
		if inDir && entry.RelayID == m.cfg.RelayID && entry.Agents == p.Agents && entry.Protocol == p.Protocol {
			m.published[dev] = p
			continue
		}
		if inDir && entry.RelayID != m.cfg.RelayID && published && pub == p && !entry.UpdatedAt.Before(m.wroteAt[dev]) {
			// Another relay took the device since this one wrote it (an
			// older entry is only this mirror lagging behind): drop
			// what is left here (split affinity), once; the cancel
			// message usually did already.
			if !m.movedAway[dev] {
				m.movedAway[dev] = true
				if m.heldStandby[dev] == entry.RelayID {
					// Its standby relay promoted it: the agent retires
					// its tunnel here by itself.
					m.cfg.OnHandOver(dev, entry.RelayID)
				} else {
					m.cfg.OnCancel(dev, "the device moved to relay "+entry.RelayID, true)
				}
			}
			continue
		}
		attaches = append(attaches, dev)
	}
	for dev := range m.published {
		if _, ok := local[dev]; ok {
			continue
		}
		if entry, inDir := m.devices.Get(deviceKey(dev)); inDir && entry.RelayID != m.cfg.RelayID && !entry.UpdatedAt.Before(m.wroteAt[dev]) {
			// Another relay took the device since this one last wrote it
			// (the mirror holds this relay's own writes as they land):
			// only that relay writes the entry's holder now, so there is
			// nothing to detach, and no need to read it to be sure.
			m.forget(dev)
			continue
		}
		detaches = append(detaches, dev)
	}
	// The writes go out in parallel: a relay taking or giving up thousands
	// of devices at once (a drain) must not publish them one by one.
	type result struct {
		dev     string
		attach  bool
		written time.Time
		done    bool
		err     error
	}
	results := make(chan result, len(attaches)+len(detaches))
	sem := make(chan struct{}, reconcileParallel)
	var wg sync.WaitGroup
	for _, dev := range attaches {
		p := local[dev]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			written, err := m.attach(ctx, dev, p, m.standbys[dev])
			results <- result{dev: dev, attach: true, written: written, err: err}
		})
	}
	for _, dev := range detaches {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			done, err := detach(octx, m.devsKV, m.cfg.RelayID, dev, hint(m.devices, deviceKey(dev)))
			cancel()
			results <- result{dev: dev, done: done, err: err}
		})
	}
	wg.Wait()
	close(results)
	var errs []error
	for r := range results {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.attach:
			m.published[r.dev] = local[r.dev]
			m.wroteAt[r.dev] = r.written
		default:
			m.forget(r.dev)
			if r.done {
				m.Record(Event{Type: EventDeviceDetached, Device: r.dev, RelayID: m.cfg.RelayID,
					Message: fmt.Sprintf("device %s: its last agent left relay %s", r.dev, m.cfg.RelayID)})
			}
		}
	}
	return errors.Join(errs...)
}

// forget drops what reconcile knows of dev, which this relay no longer
// holds.
func (m *Member) forget(dev string) {
	delete(m.published, dev)
	delete(m.movedAway, dev)
	delete(m.heldStandby, dev)
	delete(m.wroteAt, dev)
}

// reconcileParallel bounds the directory writes in flight at once.
const reconcileParallel = 32

// attach writes that this relay holds dev with presence p; promoted says
// it took the device by promoting its standby tunnel, which the old
// holder's cancel message then says.
func (m *Member) attach(ctx context.Context, dev string, p Presence, promoted bool) (written time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	res, err := attach(ctx, m.devsKV, m.cfg.RelayID, dev, p, hint(m.devices, deviceKey(dev)))
	if err != nil {
		return time.Time{}, err
	}
	m.noteAttached(dev, res, promoted)
	return res.entry.UpdatedAt, nil
}

// noteAttached tells the fleet of attach's write res of dev: the device's
// move or arrival, and, for a move, the old holder's cancel.
func (m *Member) noteAttached(dev string, res attachResult, promoted bool) {
	took := time.Duration(0)
	m.lostMu.Lock()
	since, ok := m.lostSince[dev]
	delete(m.lostSince, dev)
	m.lostMu.Unlock()
	if ok {
		if took = time.Since(since); took > time.Minute {
			took = 0 // a note from an earlier visit
		}
	}
	switch {
	case res.moved:
		msg := fmt.Sprintf("device %s moved from relay %s to relay %s", dev, res.from, m.cfg.RelayID)
		if took > 0 {
			msg += fmt.Sprintf(" in %s", took.Round(time.Millisecond))
		}
		m.Record(Event{Type: EventDeviceMoved, Device: dev, RelayID: m.cfg.RelayID, From: res.from, DurationMS: msec(took), Message: msg})
		m.cfg.OnMove(dev, res.from, took)
		// Split affinity: the old holder drops what it still has of the
		// device, so that its agents reconnect and land here.
		// A promoted standby's agent retires its old tunnel by itself.
		m.publishCancel(cancelMsg{Device: dev, RelayID: res.from, Reason: "the device moved to relay " + m.cfg.RelayID, Moved: true, Promoted: promoted})
	case res.isNew:
		m.Record(Event{Type: EventDeviceAttached, Device: dev, RelayID: m.cfg.RelayID,
			Message: fmt.Sprintf("device %s attached to relay %s (%d agent(s), %s)", dev, m.cfg.RelayID, res.entry.Agents, res.entry.Protocol)})
	}
}
