// Package fleetsecret keeps the fleet secret a relay runs in step with the
// fleet: the record of it in NATS (or a file, --fleet-secret-file), applied
// live to the relay's secret ring; the rotation of it in two phases; the
// retirement of old secrets after their grace; and secret parity, which
// says which relays run another secret than the fleet, for routing, the
// event log, metrics and the operator API. The relay's fleet member
// reports the secret on its heartbeats and lends the keeper the relay set
// and its housekeeping turn.
//
// The call sequence:
//
//	k, err := fleetsecret.Open(ctx, st, fleetsecret.Config{RelayID: id})
//	fc.Secret = k                   // the member reports k's secret on its beats
//	m, err := fleet.Open(ctx, st, fc)
//	k.Start(m)                      // follows the record and the relays from now on
//	defer k.Close()
//
// The record's layout is in docs/design/fleet-state.md, the operator's
// side in docs/fleet-secret.md.
package fleetsecret

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/kvmirror"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/store"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// opTimeout bounds one NATS operation of the keeper's loop and of
// housekeeping, so that an unreachable NATS delays a look rather than
// stopping it.
const opTimeout = 2 * time.Second

// maxAttempts bounds the retries of a compare-and-set that loses to
// another writer.
const maxAttempts = 8

// Where a relay's fleet secret comes from, as its heartbeat reports it.
const (
	SourceFleet = "fleet" // the stored Record, followed live
	SourceFile  = "file"  // --fleet-secret-file
)

// Config configures a Keeper. Zero fields take the defaults named on them.
type Config struct {
	// RelayID is this relay's id: who creates or puts back the record,
	// and who answers Status. Required.
	RelayID string
	// File, if set, is a file holding the fleet secret this relay runs
	// instead of the stored one (--fleet-secret-file): the first secret
	// signs, the others are accepted. It is read again when its content
	// changes. Default: the fleet's stored secret, followed live.
	File string
	// Interval is how often the keeper looks at the record or the file
	// and at the relays' reports, besides each change: the fleet's beat
	// interval. Default fleet.DefaultBeatInterval (2 s).
	Interval time.Duration
	// Logger receives changes of the secret and of parity; nil discards.
	Logger *slog.Logger
}

// Complete fills in defaults.
func (c *Config) Complete() {
	if c.Interval <= 0 {
		c.Interval = fleet.DefaultBeatInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate rejects a configuration that cannot work.
func (c *Config) Validate() error {
	if !fleet.ValidRelayID(c.RelayID) {
		return fmt.Errorf("fleetsecret: relay id %q is not of the form rl-<8 hex>", c.RelayID)
	}
	return nil
}

// Fleet is what a Keeper needs of the relay's fleet member; a
// *fleet.Member implements it.
type Fleet interface {
	// Relays returns every known relay with its freshness and the
	// secrets it reported on its last heartbeat.
	Relays() []fleet.RelayStatus
	// Record adds an event to the fleet's event log.
	Record(e fleet.Event)
	// BeatNow asks for a heartbeat at once, to announce a new secret.
	BeatNow()
}

var (
	_ Fleet        = (*fleet.Member)(nil)
	_ fleet.Secret = (*Keeper)(nil)
)

// Keeper runs the fleet secret of one relay. Its read methods answer from
// memory.
type Keeper struct {
	cfg  Config
	log  *slog.Logger
	kv   jetstream.KeyValue       // fleet.BucketFleet
	ring *secret.Ring             // the fleet secret this relay runs
	rec  *kvmirror.Mirror[Record] // the stored record, whatever the source
	kick chan struct{}            // asks the loop to look now

	attached atomic.Pointer[fleetRef]    // the member, set by Start
	view     atomic.Pointer[routingView] // the other relays' secrets, for routing

	loop   loopState       // used by the loop only, and Open before it
	odd    map[string]bool // the relays odd at the last sweep; used by Sweep only
	runCtx context.Context // ends when Close is called
	stop   context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// fleetRef holds the Fleet given to Start.
type fleetRef struct{ f Fleet }

// Open loads the secret this relay starts with: from the file when one is
// configured, else from the stored record, which it creates on first use.
// It returns once the mirror of the record completed its first read.
// Start makes it follow the fleet; Close stops it.
func Open(ctx context.Context, st *store.Store, cfg Config) (*Keeper, error) {
	cfg.Complete()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kv, err := st.KeyValue(ctx, fleet.BucketFleet)
	if err != nil {
		return nil, err
	}
	k := &Keeper{
		cfg:  cfg,
		log:  cfg.Logger.With(logkey.Component, "fleet", logkey.RelayID, cfg.RelayID),
		kv:   kv,
		kick: make(chan struct{}, 1),
	}
	if cfg.File != "" {
		err = k.openFile()
	} else {
		err = k.openRecord(ctx)
	}
	if err != nil {
		return nil, err
	}
	k.rec = kvmirror.New(kv, k.log, kvmirror.Config[Record]{
		Keys:     []string{RecordKey},
		OnChange: k.lookNow,
	})
	k.runCtx, k.stop = context.WithCancel(context.Background())
	k.wg.Go(func() { k.rec.Run(k.runCtx) })
	select {
	case <-k.rec.Ready():
	case <-ctx.Done():
		k.Close()
		return nil, fmt.Errorf("reading the fleet secret: %w", ctx.Err())
	}
	return k, nil
}

// Start makes the keeper follow the fleet through f, the relay's member:
// the record or file as they change, the relays' reports for routing and
// parity. Call it once, after the member opened.
func (k *Keeper) Start(f Fleet) {
	k.attached.Store(&fleetRef{f: f})
	k.refreshView()
	k.wg.Go(func() { k.run(k.runCtx) })
}

// Close stops the keeper's loops. The ring keeps what it ran.
func (k *Keeper) Close() error {
	k.once.Do(func() {
		k.stop()
		k.wg.Wait()
	})
	return nil
}

// member returns the Fleet given to Start, or nil before.
func (k *Keeper) member() Fleet {
	if r := k.attached.Load(); r != nil {
		return r.f
	}
	return nil
}

// Ring returns the fleet secret ring this relay runs: peer signatures and
// access codes read it at every use. It changes in place as the stored
// record or the secret file changes.
func (k *Keeper) Ring() *secret.Ring { return k.ring }

// Source says where this relay's fleet secret comes from: SourceFleet or
// SourceFile.
func (k *Keeper) Source() string {
	if k.cfg.File != "" {
		return SourceFile
	}
	return SourceFleet
}

// Report returns what the relay's heartbeats say of its secret.
func (k *Keeper) Report() (fingerprint string, accepted []string, source string) {
	return k.ring.Fingerprint(), k.ring.Accepted(), k.Source()
}

// RelaysChanged updates what routing knows of the other relays' secrets
// at once: the member calls it after each change of the relay set.
func (k *Keeper) RelaysChanged() { k.refreshView() }

// Resync reads the record afresh: the member calls it when it reads the
// fleet state again (NATS reconnected, or reachable again).
func (k *Keeper) Resync() { k.rec.Resync() }

// lookNow asks the loop to look now. It never blocks.
func (k *Keeper) lookNow() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// run keeps the ring current, from the stored record when it changes
// (fleet source) or from the file when its content changes (file source,
// read every interval), and refreshes what routing knows of the other
// relays' secrets, until ctx ends.
func (k *Keeper) run(ctx context.Context) {
	t := time.NewTicker(k.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-k.kick:
		}
		if k.cfg.File != "" {
			k.reloadFile()
		} else {
			k.followRecord(ctx)
		}
		k.refreshView()
		k.noteRefusals()
	}
}

// isConflict reports whether err is a lost compare-and-set.
func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// now is the time recorded in the record, in UTC to the microsecond.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
