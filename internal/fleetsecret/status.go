package fleetsecret

import (
	"slices"
	"time"
)

// Status is the fleet secret as this relay sees it: the stored record
// (never the secrets), which relays run which, and parity. The operator
// API shows it (package control's SecretStatus).
type Status struct {
	RelayID string      // the relay answering
	Source  string      // where it gets its secret: SourceFleet or SourceFile
	Record  *RecordInfo // nil when none is stored
	Parity  Parity
	Relays  []RelaySecret // every relay, sorted by id
}

// RecordInfo is the stored record without its secrets.
type RecordInfo struct {
	Generation uint64
	Signing    string
	Secrets    []SecretInfo
	Rotation   *Rotation // nil when none is in progress
	UpdatedAt  time.Time
	UpdatedBy  string
}

// SecretInfo is one secret of the record, never the secret itself.
type SecretInfo struct {
	Fingerprint string
	AddedAt     time.Time
	RetireAt    time.Time // zero unless it is an old one kept for its grace
}

// RelaySecret is what one relay reports of its fleet secret.
type RelaySecret struct {
	ID                string
	Fresh             bool
	SecretSource      string
	SecretFingerprint string
	SecretAccepted    []string
	// Odd is true when the relay runs another secret than the fleet: see
	// Parity.
	Odd bool
}

func recordInfo(r Record) RecordInfo {
	info := RecordInfo{Generation: r.Generation, Signing: r.Signing, Rotation: r.Rotation, UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy, Secrets: []SecretInfo{}}
	for _, s := range r.Secrets {
		info.Secrets = append(info.Secrets, SecretInfo{Fingerprint: s.Fingerprint, AddedAt: s.AddedAt, RetireAt: s.RetireAt})
	}
	return info
}

// Status returns the fleet secret as this relay sees it.
func (k *Keeper) Status() Status {
	relays := k.relays()
	rec := k.stored()
	p := parity(relays, rec)
	st := Status{RelayID: k.cfg.RelayID, Source: k.Source(), Parity: p, Relays: []RelaySecret{}}
	if rec != nil {
		info := recordInfo(*rec)
		st.Record = &info
	}
	for _, r := range relays {
		st.Relays = append(st.Relays, RelaySecret{
			ID: r.ID, Fresh: r.Fresh, SecretSource: r.SecretSource, SecretFingerprint: r.SecretFingerprint,
			SecretAccepted: r.SecretAccepted, Odd: slices.Contains(p.Odd, r.ID),
		})
	}
	return st
}
