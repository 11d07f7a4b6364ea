package fleetsecret

import (
	"slices"

	"github.com/switchboard-relay/switchboard/internal/fleet"
)

// What a Parity compares the relays with.
const (
	// ParityRecord: the stored record's signing secret, when any fresh
	// relay runs from the record.
	ParityRecord = "record"
	// ParityMajority: the secret most fresh relays sign with, when all of
	// them run from files.
	ParityMajority = "majority"
)

// Parity is how the fleet secrets of the fresh relays compare. Two relays
// forward to each other only when each accepts the secret the other signs
// with; a relay that does not run the fleet's secret is odd.
type Parity struct {
	// Expected is the fingerprint every relay should sign with: the stored
	// record's signing secret (Basis ParityRecord), or the one most fresh
	// relays sign with (Basis ParityMajority; a tie goes to the smallest
	// fingerprint). "" when no fresh relay reports a secret.
	Expected string
	Basis    string
	// Odd are the fresh relays that sign with another secret, or do not
	// accept the expected one, sorted; never nil. During the sign phase of
	// a rotation, signing with the old secret is not odd: that relay has
	// not applied the record yet.
	Odd []string
	// SigningFingerprints counts the distinct secrets fresh relays sign
	// with: 1 in a fleet in parity, 2 for a moment during a rotation.
	SigningFingerprints int

	checked []string // the fresh relays compared, sorted
}

// parity compares the fresh relays that report a secret with the stored
// record rec (nil when there is none).
func parity(relays []fleet.RelayStatus, rec *Record) Parity {
	p := Parity{Odd: []string{}}
	counts := map[string]int{}
	var checked []fleet.RelayStatus
	fromRecord := false
	for _, r := range relays {
		if !r.Fresh || r.SecretFingerprint == "" {
			continue
		}
		checked = append(checked, r)
		counts[r.SecretFingerprint]++
		fromRecord = fromRecord || r.SecretSource != SourceFile
	}
	p.SigningFingerprints = len(counts)
	if len(checked) == 0 {
		return p
	}
	allowed := map[string]bool{}
	if rec != nil && fromRecord {
		p.Expected, p.Basis = rec.Signing, ParityRecord
		if rot := rec.Rotation; rot != nil && rot.Phase == RotationSign {
			allowed[rot.From] = true
		}
	} else {
		p.Basis = ParityMajority
		for fp, n := range counts {
			if best := counts[p.Expected]; n > best || n == best && fp < p.Expected {
				p.Expected = fp
			}
		}
	}
	allowed[p.Expected] = true
	for _, r := range checked {
		p.checked = append(p.checked, r.ID)
		if !allowed[r.SecretFingerprint] || !slices.Contains(r.SecretAccepted, p.Expected) {
			p.Odd = append(p.Odd, r.ID)
		}
	}
	slices.Sort(p.Odd)
	slices.Sort(p.checked)
	return p
}

// Parity compares the fleet secrets of the fresh relays now.
func (k *Keeper) Parity() Parity { return parity(k.relays(), k.stored()) }

// routingView is what routing asks of the other relays' secrets, per
// relay, computed when the relay set or the secrets change and every
// interval, so that a question never takes the relay set's lock (routing
// asks while holding it).
type routingView struct {
	odd     map[string]bool // odd by Parity
	refuses map[string]bool // reports that it does not accept this relay's signing secret
}

func (k *Keeper) refreshView() {
	f := k.member()
	if f == nil {
		return
	}
	relays := f.Relays()
	p := parity(relays, k.stored())
	ours := k.ring.Fingerprint()
	v := &routingView{odd: map[string]bool{}, refuses: map[string]bool{}}
	for _, id := range p.Odd {
		v.odd[id] = true
	}
	for _, r := range relays {
		if r.SecretFingerprint != "" && r.ID != k.cfg.RelayID && !slices.Contains(r.SecretAccepted, ours) {
			v.refuses[r.ID] = true
		}
	}
	k.view.Store(v)
}

// Refuses reports whether relay id said, on its last heartbeat, that it
// does not accept the secret this relay signs with: a forward to it would
// be refused (401), so routing does not send it one.
func (k *Keeper) Refuses(id string) bool {
	v := k.view.Load()
	return v != nil && v.refuses[id]
}

// Odd reports whether relay id runs another fleet secret than the fleet
// (Parity): no device is placed there.
func (k *Keeper) Odd(id string) bool {
	v := k.view.Load()
	return v != nil && v.odd[id]
}
