package fleetsecret

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/secret"
)

// Phases of a rotation of the fleet secret.
const (
	// RotationAccept: the new secret is in the record, accepted only;
	// relays add it to what they accept.
	RotationAccept = "accept"
	// RotationSign: the new secret signs; the old one is still accepted
	// until every relay signs with the new one.
	RotationSign = "sign"
)

// ErrRotationRefused means a step of a secret rotation cannot be taken now;
// the error says why and what to do.
var ErrRotationRefused = errors.New("secret rotation refused")

// Rotation is a rotation of the fleet secret in progress.
type Rotation struct {
	Phase     string    `json:"phase"` // RotationAccept or RotationSign
	From      string    `json:"from"`  // the fingerprint of the secret that signed before
	To        string    `json:"to"`    // the fingerprint of the new one
	StartedAt time.Time `json:"started_at"`
	By        string    `json:"by"`
}

// BeginRotation starts a rotation of the fleet secret, or finds the one in
// progress: a new random secret joins the record as accepted only. by says
// who rotates, for the record and the events.
func (k *Keeper) BeginRotation(ctx context.Context, by string) (RecordInfo, error) {
	if _, err := k.rotationGuard(); err != nil {
		return RecordInfo{}, err
	}
	return k.changeRecord(ctx, by, func(r *Record) (fleet.Event, bool, error) {
		if r.Rotation != nil {
			return fleet.Event{}, false, nil // resume it
		}
		if len(r.Secrets) >= MaxSecrets {
			return fleet.Event{}, false, fmt.Errorf("%w: the record holds %d secrets already, old ones kept for their grace; wait until housekeeping drops them", ErrRotationRefused, len(r.Secrets))
		}
		s := secret.New()
		fp := secret.Fingerprint(s)
		t := now()
		r.Secrets = append(r.Secrets, StoredSecret{Fingerprint: fp, Secret: s, AddedAt: t})
		r.Rotation = &Rotation{Phase: RotationAccept, From: r.Signing, To: fp, StartedAt: t, By: by}
		return fleet.Event{Message: fmt.Sprintf("secret rotation from %s to %s begun by %s: every relay now accepts %s, none signs with it yet", r.Signing, fp, by, fp)}, true, nil
	})
}

// SignWithNew takes the second step of a rotation: the new secret signs.
// Refused until every fresh relay reports that it accepts it.
func (k *Keeper) SignWithNew(ctx context.Context, by string) (RecordInfo, error) {
	fresh, err := k.rotationGuard()
	if err != nil {
		return RecordInfo{}, err
	}
	return k.changeRecord(ctx, by, func(r *Record) (fleet.Event, bool, error) {
		rot := r.Rotation
		switch {
		case rot == nil:
			return fleet.Event{}, false, fmt.Errorf("%w: no rotation is in progress; begin one first", ErrRotationRefused)
		case rot.Phase == RotationSign:
			return fleet.Event{}, false, nil
		}
		if late := relaysWithout(fresh, rot.To, false); len(late) > 0 {
			return fleet.Event{}, false, fmt.Errorf("%w: relay(s) %s do not accept the new secret %s yet; signing with it now would break their forwards", ErrRotationRefused, strings.Join(late, ", "), rot.To)
		}
		rot.Phase, r.Signing = RotationSign, rot.To
		return fleet.Event{Message: fmt.Sprintf("secret rotation: relays now sign with %s and still accept %s", rot.To, rot.From)}, true, nil
	})
}

// FinishRotation takes the last step of a rotation: the old secret is
// dropped, or kept accepted for grace (housekeeping drops it then).
// Refused until every fresh relay reports signing with the new secret.
func (k *Keeper) FinishRotation(ctx context.Context, by string, grace time.Duration) (RecordInfo, error) {
	fresh, err := k.rotationGuard()
	if err != nil {
		return RecordInfo{}, err
	}
	return k.changeRecord(ctx, by, func(r *Record) (fleet.Event, bool, error) {
		rot := r.Rotation
		switch {
		case rot == nil:
			return fleet.Event{}, false, fmt.Errorf("%w: no rotation is in progress", ErrRotationRefused)
		case rot.Phase != RotationSign:
			return fleet.Event{}, false, fmt.Errorf("%w: the new secret %s does not sign yet; take the sign step first", ErrRotationRefused, rot.To)
		}
		if late := relaysWithout(fresh, rot.To, true); len(late) > 0 {
			return fleet.Event{}, false, fmt.Errorf("%w: relay(s) %s do not sign with the new secret %s yet; dropping the old one now would break their forwards", ErrRotationRefused, strings.Join(late, ", "), rot.To)
		}
		msg := fmt.Sprintf("secret rotation done: relays sign with %s; %s dropped", rot.To, rot.From)
		if grace > 0 {
			until := now().Add(grace)
			for i := range r.Secrets {
				if r.Secrets[i].Fingerprint == rot.From {
					r.Secrets[i].RetireAt = until
				}
			}
			msg = fmt.Sprintf("secret rotation done: relays sign with %s; %s stays accepted until %s", rot.To, rot.From, until.Format(time.RFC3339))
		} else {
			r.Secrets = slices.DeleteFunc(r.Secrets, func(s StoredSecret) bool { return s.Fingerprint == rot.From })
		}
		r.Rotation = nil
		return fleet.Event{Message: msg}, true, nil
	})
}

// rotationGuard refuses a rotation step while a fresh relay cannot follow
// the stored record: it runs a file-supplied secret. It returns the fresh
// relays.
func (k *Keeper) rotationGuard() ([]fleet.RelayStatus, error) {
	var fresh []fleet.RelayStatus
	var files []string
	for _, r := range k.relays() {
		if !r.Fresh {
			continue
		}
		fresh = append(fresh, r)
		if r.SecretSource == SourceFile {
			files = append(files, r.ID)
		}
	}
	slices.Sort(files)
	if len(files) > 0 {
		return nil, fmt.Errorf("%w: relay(s) %s run a fleet secret from --fleet-secret-file, which a rotation cannot change; rotate the file on every relay instead, or restart them without the flag so that they follow the stored secret (see docs/fleet-secret.md)",
			ErrRotationRefused, strings.Join(files, ", "))
	}
	return fresh, nil
}

// changeRecord applies change to the stored record with compare-and-set
// and records the event it returns.
func (k *Keeper) changeRecord(ctx context.Context, by string, change func(*Record) (fleet.Event, bool, error)) (RecordInfo, error) {
	var ev fleet.Event
	rec, err := updateRecord(ctx, k.kv, func(cur *Record, found bool) (bool, error) {
		if !found {
			return false, fmt.Errorf("%w: no fleet secret is stored (do the relays run from files?)", ErrRotationRefused)
		}
		if err := cur.validate(); err != nil {
			return false, err
		}
		e, write, err := change(cur)
		if err != nil || !write {
			return false, err
		}
		cur.Generation++
		cur.UpdatedAt, cur.UpdatedBy = now(), by
		ev = e
		return true, nil
	})
	if err != nil {
		return RecordInfo{}, err
	}
	if f := k.member(); ev.Message != "" && f != nil {
		ev.Type = fleet.EventSecretRotation
		f.Record(ev)
	}
	return recordInfo(rec), nil
}

// relaysWithout returns the ids of the relays that do not accept fp, or,
// with signing, do not sign with it.
func relaysWithout(relays []fleet.RelayStatus, fp string, signing bool) []string {
	var out []string
	for _, r := range relays {
		if signing && r.SecretFingerprint != fp || !signing && !slices.Contains(r.SecretAccepted, fp) {
			out = append(out, r.ID)
		}
	}
	slices.Sort(out)
	return out
}

// relays returns the relay set as the member has it, or none before Start.
func (k *Keeper) relays() []fleet.RelayStatus {
	if f := k.member(); f != nil {
		return f.Relays()
	}
	return nil
}
