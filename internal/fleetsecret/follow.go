package fleetsecret

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"slices"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// loopState is what the keeper's loop remembers between its looks.
type loopState struct {
	applied  Record            // the stored record this relay runs (fleet source)
	fileSum  [sha256.Size]byte // the content of the secret file this relay runs
	badSum   [sha256.Size]byte // a file content already reported unreadable
	badFile  bool              // the file could not be read at the last look
	badGen   uint64            // a record generation already reported unusable
	restored bool              // this relay put a lost record back
	refusing string            // the relays that refused this relay's secret at the last look
}

// followRecord applies the stored record when it changed, and puts it back
// when it is gone (a NATS server restarted without its files): the relays
// all run the same record, and the first to write it back wins.
func (k *Keeper) followRecord(ctx context.Context) {
	if synced, _ := k.rec.Status(); !synced {
		return
	}
	rec, ok := k.rec.Get(RecordKey)
	if !ok {
		k.restoreRecord(ctx)
		return
	}
	k.loop.restored = false
	if err := rec.validate(); err != nil {
		if k.loop.badGen != rec.Generation {
			k.log.Warn("the stored fleet secret cannot be used; still running the one applied before", logkey.Err, err)
			k.loop.badGen = rec.Generation
		}
		return
	}
	k.applyRecord(rec)
}

// applyRecord makes the ring run rec.
func (k *Keeper) applyRecord(rec Record) {
	k.loop.applied = rec
	fps := rec.fingerprints()
	cur := k.ring.Accepted()
	if k.ring.Fingerprint() == fps[0] && len(cur) == len(fps) && !slices.ContainsFunc(fps, func(fp string) bool { return !slices.Contains(cur, fp) }) {
		return
	}
	signing, others := rec.keys()
	if err := k.ring.Set(signing, others...); err != nil {
		k.log.Warn("the stored fleet secret cannot be used; still running the one applied before", logkey.Err, err)
		return
	}
	k.log.Info("fleet secret applied", logkey.Fingerprint, fps[0], logkey.Accepted, strings.Join(fps, ","), logkey.Generation, rec.Generation)
	k.beatNow()
}

// restoreRecord stores the record this relay runs again, once, when the
// stored one is gone.
func (k *Keeper) restoreRecord(ctx context.Context) {
	if k.loop.restored || k.loop.applied.Generation == 0 {
		return
	}
	data, err := json.Marshal(k.loop.applied)
	if err != nil {
		return
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := k.kv.Create(octx, RecordKey, data); err != nil {
		return // another relay put it back, or NATS is away: the next look tells
	}
	k.loop.restored = true
	k.log.Info("the stored fleet secret was gone: stored the one this relay runs again", logkey.Fingerprint, k.loop.applied.Signing)
}

// noteRefusals logs, when it changes, which relays report that they do not
// accept the secret this relay signs with: forwards to them are held back.
func (k *Keeper) noteRefusals() {
	var ids []string
	if v := k.view.Load(); v != nil {
		for id := range v.refuses {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	now := strings.Join(ids, ", ")
	if now == k.loop.refusing {
		return
	}
	k.loop.refusing = now
	if now == "" {
		k.log.Info("every relay accepts this relay's fleet secret again")
		return
	}
	k.log.Warn("relays do not accept the fleet secret this relay signs with: no request is forwarded to them; see 'switchboard ctl secret status'",
		logkey.Relays, now, logkey.Fingerprint, k.ring.Fingerprint())
}

// beatNow asks the member for a heartbeat, so that the other relays learn
// of a new secret at once.
func (k *Keeper) beatNow() {
	if f := k.member(); f != nil {
		f.BeatNow()
	}
}
