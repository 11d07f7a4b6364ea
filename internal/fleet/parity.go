package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// What a SecretParity compares the relays with.
const (
	// ParityRecord: the stored record's signing secret, when any fresh
	// relay runs from the record.
	ParityRecord = "record"
	// ParityMajority: the secret most fresh relays sign with, when all of
	// them run from files.
	ParityMajority = "majority"
)

// SecretParity is how the fleet secrets of the fresh relays compare. Two
// relays forward to each other only when each accepts the secret the other
// signs with; a relay that does not run the fleet's secret is odd.
type SecretParity struct {
	// Expected is the fingerprint every relay should sign with: the stored
	// record's signing secret (Basis "record"), or the one most fresh
	// relays sign with (Basis "majority"; a tie goes to the smallest
	// fingerprint). "" when no fresh relay reports a secret.
	Expected string `json:"expected"`
	Basis    string `json:"basis"`
	// Odd are the fresh relays that sign with another secret, or do not
	// accept the expected one, sorted. During the sign phase of a
	// rotation, signing with the old secret is not odd: that relay has
	// not applied the record yet.
	Odd []string `json:"odd"`
	// SigningFingerprints counts the distinct secrets fresh relays sign
	// with: 1 in a fleet in parity, 2 for a moment during a rotation.
	SigningFingerprints int `json:"signing_fingerprints"`

	checked []string // the fresh relays compared
}

// secretParity compares the relays that fresh says are fresh and that
// report a secret with the stored record rec (nil when there is none).
func secretParity(relays []Relay, fresh func(Relay) bool, rec *SecretRecord) SecretParity {
	p := SecretParity{Odd: []string{}}
	counts := map[string]int{}
	var checked []Relay
	fromRecord := false
	for _, r := range relays {
		if !fresh(r) || r.SecretFingerprint == "" {
			continue
		}
		checked = append(checked, r)
		counts[r.SecretFingerprint]++
		fromRecord = fromRecord || r.SecretSource != SecretSourceFile
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

// SecretParity compares the fleet secrets of the fresh relays now.
func (m *Member) SecretParity() SecretParity {
	v := m.view(time.Now())
	return secretParity(m.relays.All(), func(r Relay) bool { return v.fresh(r.LastSeenAt) }, m.storedSecret())
}

// storedSecret returns the stored record as the mirror has it, or nil.
func (m *Member) storedSecret() *SecretRecord {
	if r, ok := m.secretRec.Get(SecretRecordKey); ok {
		return &r
	}
	return nil
}

// secretView is what routing asks of the other relays' secrets, per relay,
// computed when the relay set or the secrets change and every beat
// interval, so that a question never takes the relay set's lock (routing
// asks while holding it).
type secretView struct {
	odd     map[string]bool // odd by SecretParity
	refuses map[string]bool // reports that it does not accept this relay's signing secret
}

func (m *Member) refreshSecretView() {
	fv := m.view(time.Now())
	relays := m.relays.All()
	p := secretParity(relays, func(r Relay) bool { return fv.fresh(r.LastSeenAt) }, m.storedSecret())
	ours := m.secrets.Fingerprint()
	v := &secretView{odd: map[string]bool{}, refuses: map[string]bool{}}
	for _, id := range p.Odd {
		v.odd[id] = true
	}
	for _, r := range relays {
		if r.SecretFingerprint != "" && r.ID != m.cfg.RelayID && !slices.Contains(r.SecretAccepted, ours) {
			v.refuses[r.ID] = true
		}
	}
	m.secretView.Store(v)
}

// SecretRefuses reports whether relay id said, on its last heartbeat, that
// it does not accept the secret this relay signs with: a forward to it
// would be refused (401), so routing does not send it one.
func (m *Member) SecretRefuses(id string) bool {
	v := m.secretView.Load()
	return v != nil && v.refuses[id]
}

// SecretOdd reports whether relay id runs another fleet secret than the
// fleet (SecretParity): no device is placed there.
func (m *Member) SecretOdd(id string) bool {
	v := m.secretView.Load()
	return v != nil && v.odd[id]
}

// checkSecretParity records, for the lease holder, each change of the set
// of odd relays: secret.mismatch for a relay that became odd, and
// secret.parity for one that no longer is.
func (m *Member) checkSecretParity(v view) {
	relays := m.relays.All()
	rec := m.storedSecret()
	p := secretParity(relays, func(r Relay) bool { return v.fresh(r.LastSeenAt) }, rec)
	odd := map[string]bool{}
	byID := map[string]Relay{}
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
		if m.hk.odd[id] {
			continue
		}
		r := byID[id]
		m.Record(Event{Type: EventSecretMismatch, RelayID: id,
			Message: fmt.Sprintf("relay %s runs another fleet secret: it signs with %s and accepts %s, but the fleet signs with %s (%s); forwards between it and the other relays are refused until it runs the fleet's secret (odd relays: %s)",
				id, r.SecretFingerprint, strings.Join(r.SecretAccepted, ", "), p.Expected, basis, oddList)})
	}
	for id := range m.hk.odd {
		if odd[id] {
			continue
		}
		msg := fmt.Sprintf("relay %s runs the fleet's secret %s again", id, p.Expected)
		if r, ok := byID[id]; !ok || !v.fresh(r.LastSeenAt) {
			msg = fmt.Sprintf("relay %s stopped beating: it no longer counts for secret parity", id)
		}
		if len(p.Odd) == 0 {
			msg += "; every fresh relay runs the fleet's secret"
		} else {
			msg += "; still odd: " + oddList
		}
		m.Record(Event{Type: EventSecretParity, RelayID: id, Message: msg})
	}
	m.hk.odd = odd
}

var (
	secretMismatchDesc = prometheus.NewDesc("switchboard_fleet_secret_mismatch",
		"1 for each fresh relay that runs another fleet secret than the fleet (its forwards to and from the others are refused), 0 for the others.",
		[]string{"relay"}, nil)
	secretFingerprintsDesc = prometheus.NewDesc("switchboard_fleet_secret_fingerprints",
		"Distinct fleet secrets the fresh relays sign with: 1 in a fleet in parity.", nil, nil)
)

// secretCollector reports secret parity from one SecretParity per scrape.
type secretCollector struct{ m *Member }

func (c *secretCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- secretMismatchDesc
	ch <- secretFingerprintsDesc
}

func (c *secretCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.m.SecretParity()
	for _, id := range p.checked {
		ch <- prometheus.MustNewConstMetric(secretMismatchDesc, prometheus.GaugeValue, b2f(slices.Contains(p.Odd, id)), id)
	}
	ch <- prometheus.MustNewConstMetric(secretFingerprintsDesc, prometheus.GaugeValue, float64(p.SigningFingerprints))
}
