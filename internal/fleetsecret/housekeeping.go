package fleetsecret

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/fleet"
)

// Sweep is the fleet secret's part of housekeeping, which the member's
// lease holder calls after each of its sweeps (taken: the first since it
// took the lease): it records each change of the set of odd relays, and
// drops the old secrets whose grace ended.
func (k *Keeper) Sweep(ctx context.Context, taken bool) {
	f := k.member()
	if f == nil {
		return
	}
	if taken {
		k.odd = nil // a new holder reports every odd relay again
	}
	k.checkParity(f)
	k.retire(ctx, time.Now())
}

// checkParity records secret.mismatch for a relay that became odd, and
// secret.parity for one that no longer is.
func (k *Keeper) checkParity(f Fleet) {
	relays := f.Relays()
	p := parity(relays, k.stored())
	odd := map[string]bool{}
	byID := map[string]fleet.RelayStatus{}
	for _, r := range relays {
		byID[r.ID] = r
	}
	oddList := strings.Join(p.Odd, ", ")
	basis := "the stored fleet secret"
	if p.Basis == ParityMajority {
		basis = "what most relays sign with"
	}
	for _, id := range p.Odd {
		odd[id] = true
		if k.odd[id] {
			continue
		}
		r := byID[id]
		f.Record(fleet.Event{Type: fleet.EventSecretMismatch, RelayID: id,
			Message: fmt.Sprintf("relay %s runs another fleet secret: it signs with %s and accepts %s, but the fleet signs with %s (%s); forwards between it and the other relays are refused until it runs the fleet's secret (odd relays: %s)",
				id, r.SecretFingerprint, strings.Join(r.SecretAccepted, ", "), p.Expected, basis, oddList)})
	}
	for id := range k.odd {
		if odd[id] {
			continue
		}
		msg := fmt.Sprintf("relay %s runs the fleet's secret %s again", id, p.Expected)
		if r, ok := byID[id]; !ok || !r.Fresh {
			msg = fmt.Sprintf("relay %s stopped beating: it no longer counts for secret parity", id)
		}
		if len(p.Odd) == 0 {
			msg += "; every fresh relay runs the fleet's secret"
		} else {
			msg += "; still odd: " + oddList
		}
		f.Record(fleet.Event{Type: fleet.EventSecretParity, RelayID: id, Message: msg})
	}
	k.odd = odd
}

// retire drops the old secrets whose grace ended by t.
func (k *Keeper) retire(ctx context.Context, t time.Time) {
	rec, ok := k.rec.Get(RecordKey)
	if !ok || !slices.ContainsFunc(rec.Secrets, func(s StoredSecret) bool { return retired(rec, s, t) }) {
		return
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	_, _ = k.changeRecord(octx, k.cfg.RelayID, func(r *Record) (fleet.Event, bool, error) {
		var gone []string
		r.Secrets = slices.DeleteFunc(r.Secrets, func(s StoredSecret) bool {
			if retired(*r, s, t) {
				gone = append(gone, s.Fingerprint)
				return true
			}
			return false
		})
		if len(gone) == 0 {
			return fleet.Event{}, false, nil
		}
		return fleet.Event{Message: fmt.Sprintf("old fleet secret(s) %s dropped: their grace after a rotation ended", strings.Join(gone, ", "))}, true, nil
	})
}

// retired reports whether s is an old secret of r whose grace ended by t.
func retired(r Record, s StoredSecret, t time.Time) bool {
	inRotation := r.Rotation != nil && (s.Fingerprint == r.Rotation.From || s.Fingerprint == r.Rotation.To)
	return !s.RetireAt.IsZero() && t.After(s.RetireAt) && s.Fingerprint != r.Signing && !inRotation
}
