package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/secret"
)

// SecretRecordKey is the key of the SecretRecord in BucketFleet.
const SecretRecordKey = "fleet_secret"

// SecretRecordFormat is the format of SecretRecord this version reads and
// writes.
const SecretRecordFormat = 1

// MaxSecrets bounds the secrets a record accepts at once: the signing one,
// one being rotated in, and old ones kept for their grace.
const MaxSecrets = 8

// Where a relay's fleet secret comes from, as its heartbeat reports it.
const (
	SecretSourceFleet = "fleet" // the stored SecretRecord, followed live
	SecretSourceFile  = "file"  // --fleet-secret-file
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

// SecretRecord is the fleet secret in BucketFleet, as JSON, under
// "fleet_secret": the secret relays sign forwards (and access codes) with
// and every secret they accept. Relays that run from it watch it and apply
// each change at once; a rotation changes it in two phases (see Rotation).
type SecretRecord struct {
	Format int `json:"format"`
	// Generation counts the changes of the record: each write adds one.
	Generation uint64 `json:"generation"`
	// Signing is the fingerprint of the secret relays sign with.
	Signing string `json:"signing"`
	// Secrets are every accepted secret, the signing one among them.
	Secrets []StoredSecret `json:"secrets"`
	// Rotation is the rotation in progress, nil when there is none: kept
	// here so that an interrupted rotation resumes from any machine.
	Rotation  *Rotation `json:"rotation,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"` // a relay id, or who ran the rotation
}

// StoredSecret is one secret of a SecretRecord.
type StoredSecret struct {
	Fingerprint string    `json:"fingerprint"`
	Secret      []byte    `json:"secret"` // base64 in JSON
	AddedAt     time.Time `json:"added_at"`
	// RetireAt, when set, is when housekeeping drops this secret: an old
	// signing secret kept accepted for a grace after a rotation.
	RetireAt time.Time `json:"retire_at,omitzero"`
}

// Rotation is a rotation of the fleet secret in progress.
type Rotation struct {
	Phase     string    `json:"phase"` // RotationAccept or RotationSign
	From      string    `json:"from"`  // the fingerprint of the secret that signed before
	To        string    `json:"to"`    // the fingerprint of the new one
	StartedAt time.Time `json:"started_at"`
	By        string    `json:"by"`
}

// newSecretRecord returns a first record that signs with s.
func newSecretRecord(s []byte, by string) SecretRecord {
	t := now()
	fp := secret.Fingerprint(s)
	return SecretRecord{
		Format: SecretRecordFormat, Generation: 1, Signing: fp,
		Secrets:   []StoredSecret{{Fingerprint: fp, Secret: s, AddedAt: t}},
		UpdatedAt: t, UpdatedBy: by,
	}
}

// validate rejects a record this relay cannot run from.
func (r *SecretRecord) validate() error {
	if r.Format != SecretRecordFormat {
		return fmt.Errorf("the stored fleet secret has format %d; this version reads format %d", r.Format, SecretRecordFormat)
	}
	seen := map[string]bool{}
	for _, s := range r.Secrets {
		if len(s.Secret) < secret.MinBytes {
			return fmt.Errorf("the stored fleet secret %s has %d bytes, fewer than %d", s.Fingerprint, len(s.Secret), secret.MinBytes)
		}
		if secret.Fingerprint(s.Secret) != s.Fingerprint {
			return fmt.Errorf("the stored fleet secret %s does not match its fingerprint", s.Fingerprint)
		}
		seen[s.Fingerprint] = true
	}
	if !seen[r.Signing] {
		return fmt.Errorf("the stored fleet secret signs with %s, which it does not hold", r.Signing)
	}
	if r.Rotation != nil && (!seen[r.Rotation.To] || r.Rotation.Phase != RotationAccept && r.Rotation.Phase != RotationSign) {
		return fmt.Errorf("the stored fleet secret's rotation (%s to %s, phase %q) is malformed", r.Rotation.From, r.Rotation.To, r.Rotation.Phase)
	}
	return nil
}

// keys returns the signing secret and the other accepted ones.
func (r *SecretRecord) keys() (signing []byte, others [][]byte) {
	for _, s := range r.Secrets {
		if s.Fingerprint == r.Signing {
			signing = s.Secret
		} else {
			others = append(others, s.Secret)
		}
	}
	return signing, others
}

// fingerprints returns the fingerprints of the accepted secrets, the
// signing one first, as a Ring of the record lists them.
func (r *SecretRecord) fingerprints() []string {
	out := []string{r.Signing}
	for _, s := range r.Secrets {
		if s.Fingerprint != r.Signing {
			out = append(out, s.Fingerprint)
		}
	}
	return out
}

// secretOf returns the stored secret with fingerprint fp.
func (r *SecretRecord) secretOf(fp string) ([]byte, bool) {
	for _, s := range r.Secrets {
		if s.Fingerprint == fp {
			return s.Secret, true
		}
	}
	return nil, false
}

// loadSecretRecord reads the fleet secret record, creating it with a new
// random secret on first use; the first relay to create it wins, and every
// relay reads the same one.
func loadSecretRecord(ctx context.Context, kv jetstream.KeyValue, by string) (rec SecretRecord, created bool, err error) {
	for range maxAttempts {
		e, err := kv.Get(ctx, SecretRecordKey)
		switch {
		case err == nil:
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				return rec, false, fmt.Errorf("the stored fleet secret %s/%s is malformed: %w", kv.Bucket(), SecretRecordKey, err)
			}
			return rec, false, rec.validate()
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return rec, false, fmt.Errorf("reading the fleet secret: %w", err)
		}
		rec = newSecretRecord(secret.New(), by)
		data, err := json.Marshal(rec)
		if err != nil {
			return rec, false, err
		}
		if _, err := kv.Create(ctx, SecretRecordKey, data); err == nil {
			return rec, true, nil
		} else if !isConflict(err) {
			return rec, false, fmt.Errorf("storing the fleet secret: %w", err)
		}
	}
	return rec, false, fmt.Errorf("fleet secret: %w", ErrConflict)
}

// readSecretFile reads a fleet secret file and returns its secrets, the
// signing one first, and a digest of its content.
func readSecretFile(path string) ([][]byte, [sha256.Size]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, [sha256.Size]byte{}, err
	}
	keys, err := parseSecretFile(data)
	return keys, sha256.Sum256(data), err
}

// parseSecretFile parses the content of a fleet secret file: one secret per
// line, the first signs and the others are accepted; a line is hex when it
// is an even number of hex digits, else standard base64 (padding optional);
// blank lines and lines starting with '#' are skipped. Errors name lines,
// never their content.
func parseSecretFile(data []byte) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := decodeSecretLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		if len(k) < secret.MinBytes {
			return nil, fmt.Errorf("line %d: a secret of %d bytes is too short; use %d random bytes (openssl rand -base64 %d)", i+1, len(k), secret.Bytes, secret.Bytes)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no secret in the file; put one, base64 or hex, on the first line (openssl rand -base64 %d)", secret.Bytes)
	}
	if len(keys) > MaxSecrets {
		return nil, fmt.Errorf("%d secrets; at most %d are accepted at once", len(keys), MaxSecrets)
	}
	return keys, nil
}

func decodeSecretLine(line string) ([]byte, error) {
	if len(line)%2 == 0 {
		if k, err := hex.DecodeString(line); err == nil {
			return k, nil
		}
	}
	if k, err := base64.StdEncoding.DecodeString(line); err == nil {
		return k, nil
	}
	if k, err := base64.RawStdEncoding.DecodeString(line); err == nil {
		return k, nil
	}
	return nil, errors.New("neither hex nor standard base64")
}

// secretState is what the secret loop remembers between its runs.
type secretState struct {
	applied  SecretRecord      // the stored record this relay runs (fleet source)
	fileSum  [sha256.Size]byte // the content of the secret file this relay runs
	badSum   [sha256.Size]byte // a file content already reported unreadable
	badFile  bool              // the file could not be read at the last look
	badGen   uint64            // a record generation already reported unusable
	restored bool              // this relay put a lost record back
	refusing string            // the relays that refused this relay's secret at the last look
}

// openSecret loads the secret this relay starts with: from the file when
// one is configured, else from the stored record, which it creates on
// first use.
func (m *Member) openSecret(ctx context.Context) error {
	if path := m.cfg.SecretFile; path != "" {
		keys, sum, err := readSecretFile(path)
		if err != nil {
			return fmt.Errorf("fleet secret file %s: %w", path, err)
		}
		if m.secrets, err = secret.NewRing(keys[0], keys[1:]...); err != nil {
			return fmt.Errorf("fleet secret file %s: %w", path, err)
		}
		m.sec.fileSum = sum
		m.warnLoosePermissions(path)
		m.log.Info("running the fleet secret from a file, not the fleet's stored one", "path", path,
			"fingerprint", m.secrets.Fingerprint(), "accepted", strings.Join(m.secrets.Accepted(), ","))
		return nil
	}
	rec, created, err := loadSecretRecord(ctx, m.fleetKV, m.cfg.RelayID)
	if err != nil {
		return err
	}
	signing, others := rec.keys()
	if m.secrets, err = secret.NewRing(signing, others...); err != nil {
		return err
	}
	m.sec.applied = rec
	if created {
		m.log.Info("stored the fleet secret", "fingerprint", rec.Signing)
	}
	return nil
}

// warnLoosePermissions warns when others than the owner may read path.
func (m *Member) warnLoosePermissions(path string) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		m.log.Warn("the fleet secret file is readable by others than its owner; chmod 600 it", "path", path, "mode", fi.Mode().Perm().String())
	}
}

// Secrets returns the fleet secret ring this relay runs. It changes in
// place as the stored record or the secret file changes.
func (m *Member) Secrets() *secret.Ring { return m.secrets }

// SecretSource says where this relay's fleet secret comes from:
// SecretSourceFleet or SecretSourceFile.
func (m *Member) SecretSource() string {
	if m.cfg.SecretFile != "" {
		return SecretSourceFile
	}
	return SecretSourceFleet
}

// kickSecret asks the secret loop to look now. It never blocks.
func (m *Member) kickSecret() { nudge(m.secretKick) }

// secretLoop keeps the ring current: from the stored record when it changes
// (fleet source), or from the file when its content changes (file source,
// read every beat interval), and refreshes what routing knows of the other
// relays' secrets.
func (m *Member) secretLoop(ctx context.Context) {
	m.everyBeat(ctx, m.secretKick, func(ctx context.Context) {
		if m.cfg.SecretFile != "" {
			m.reloadSecretFile()
		} else {
			m.followSecretRecord(ctx)
		}
		m.refreshSecretView()
		m.noteRefusals()
	})
}

// noteRefusals logs, when it changes, which relays report that they do not
// accept the secret this relay signs with: forwards to them are held back.
func (m *Member) noteRefusals() {
	var ids []string
	if v := m.secretView.Load(); v != nil {
		for id := range v.refuses {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	now := strings.Join(ids, ", ")
	if now == m.sec.refusing {
		return
	}
	m.sec.refusing = now
	if now == "" {
		m.log.Info("every relay accepts this relay's fleet secret again")
		return
	}
	m.log.Warn("relays do not accept the fleet secret this relay signs with: no request is forwarded to them; see 'switchboard ctl secret status'",
		"relays", now, "fingerprint", m.secrets.Fingerprint())
}

// reloadSecretFile applies the secret file when its content changed. A file
// that cannot be read or parsed leaves the running secret as it is.
func (m *Member) reloadSecretFile() {
	path := m.cfg.SecretFile
	keys, sum, err := readSecretFile(path)
	if err == nil && sum == m.sec.fileSum {
		m.sec.badFile = false
		return
	}
	if err == nil {
		err = m.secrets.Set(keys[0], keys[1:]...)
	}
	if err != nil {
		if !m.sec.badFile || sum != m.sec.badSum {
			m.log.Warn("the fleet secret file cannot be used; still running the secret read before", "path", path, "error", err)
		}
		m.sec.badFile, m.sec.badSum = true, sum
		return
	}
	m.sec.fileSum, m.sec.badFile = sum, false
	m.warnLoosePermissions(path)
	m.log.Info("fleet secret file changed: applied", "path", path,
		"fingerprint", m.secrets.Fingerprint(), "accepted", strings.Join(m.secrets.Accepted(), ","))
	m.BeatNow()
}

// followSecretRecord applies the stored record when it changed, and puts
// it back when it is gone (a NATS server restarted without its files): the
// relays all run the same record, and the first to write it back wins.
func (m *Member) followSecretRecord(ctx context.Context) {
	if synced, _ := m.secretRec.Status(); !synced {
		return
	}
	rec, ok := m.secretRec.Get(SecretRecordKey)
	if !ok {
		m.restoreSecretRecord(ctx)
		return
	}
	m.sec.restored = false
	if err := rec.validate(); err != nil {
		if m.sec.badGen != rec.Generation {
			m.log.Warn("the stored fleet secret cannot be used; still running the one applied before", "error", err)
			m.sec.badGen = rec.Generation
		}
		return
	}
	m.applySecretRecord(rec)
}

// applySecretRecord makes the ring run rec.
func (m *Member) applySecretRecord(rec SecretRecord) {
	m.sec.applied = rec
	fps := rec.fingerprints()
	cur := m.secrets.Accepted()
	if m.secrets.Fingerprint() == fps[0] && len(cur) == len(fps) && !slices.ContainsFunc(fps, func(fp string) bool { return !slices.Contains(cur, fp) }) {
		return
	}
	signing, others := rec.keys()
	if err := m.secrets.Set(signing, others...); err != nil {
		m.log.Warn("the stored fleet secret cannot be used; still running the one applied before", "error", err)
		return
	}
	m.log.Info("fleet secret applied", "fingerprint", fps[0], "accepted", strings.Join(fps, ","), "generation", rec.Generation)
	m.BeatNow()
}

func (m *Member) restoreSecretRecord(ctx context.Context) {
	if m.sec.restored || m.sec.applied.Generation == 0 {
		return
	}
	data, err := json.Marshal(m.sec.applied)
	if err != nil {
		return
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := m.fleetKV.Create(octx, SecretRecordKey, data); err != nil {
		return // another relay put it back, or NATS is away: the next look tells
	}
	m.sec.restored = true
	m.log.Info("the stored fleet secret was gone: stored the one this relay runs again", "fingerprint", m.sec.applied.Signing)
}

// SecretInfo is one secret of the record as the operator API shows it:
// never the secret itself.
type SecretInfo struct {
	Fingerprint string    `json:"fingerprint"`
	AddedAt     time.Time `json:"added_at"`
	RetireAt    time.Time `json:"retire_at,omitzero"`
}

// SecretRecordInfo is the stored record as the operator API shows it.
type SecretRecordInfo struct {
	Generation uint64       `json:"generation"`
	Signing    string       `json:"signing"`
	Secrets    []SecretInfo `json:"secrets"`
	Rotation   *Rotation    `json:"rotation"`
	UpdatedAt  time.Time    `json:"updated_at"`
	UpdatedBy  string       `json:"updated_by"`
}

func recordInfo(r SecretRecord) SecretRecordInfo {
	info := SecretRecordInfo{Generation: r.Generation, Signing: r.Signing, Rotation: r.Rotation, UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy, Secrets: []SecretInfo{}}
	for _, s := range r.Secrets {
		info.Secrets = append(info.Secrets, SecretInfo{Fingerprint: s.Fingerprint, AddedAt: s.AddedAt, RetireAt: s.RetireAt})
	}
	return info
}

// RelaySecret is what one relay reports of its fleet secret.
type RelaySecret struct {
	ID                string   `json:"id"`
	Fresh             bool     `json:"fresh"`
	SecretSource      string   `json:"secret_source"`
	SecretFingerprint string   `json:"secret_fingerprint"`
	SecretAccepted    []string `json:"secret_accepted"`
	// Odd is true when the relay runs another secret than the fleet: see
	// SecretParity.
	Odd bool `json:"odd"`
}

// SecretStatus is the fleet secret as the relay answering sees it: the
// stored record (never the secrets), which relays run which, and parity.
type SecretStatus struct {
	RelayID string            `json:"relay_id"`
	Source  string            `json:"source"` // where the answering relay gets its secret
	Record  *SecretRecordInfo `json:"record"` // null when none is stored
	Parity  SecretParity      `json:"parity"`
	Relays  []RelaySecret     `json:"relays"`
}

// SecretStatus returns the fleet secret as this relay sees it.
func (m *Member) SecretStatus() SecretStatus {
	v := m.view(time.Now())
	relays := m.relays.All()
	var rec *SecretRecord
	if r, ok := m.secretRec.Get(SecretRecordKey); ok {
		rec = &r
	}
	p := secretParity(relays, func(r Relay) bool { return v.fresh(r.LastSeenAt) }, rec)
	st := SecretStatus{RelayID: m.cfg.RelayID, Source: m.SecretSource(), Parity: p, Relays: []RelaySecret{}}
	if rec != nil {
		info := recordInfo(*rec)
		st.Record = &info
	}
	for _, r := range relays {
		st.Relays = append(st.Relays, RelaySecret{
			ID: r.ID, Fresh: v.fresh(r.LastSeenAt), SecretSource: r.SecretSource, SecretFingerprint: r.SecretFingerprint,
			SecretAccepted: nonNil(r.SecretAccepted), Odd: slices.Contains(p.Odd, r.ID),
		})
	}
	slices.SortFunc(st.Relays, func(a, b RelaySecret) int { return strings.Compare(a.ID, b.ID) })
	return st
}

// rotationGuard refuses a rotation step while a fresh relay cannot follow
// the stored record: it runs a file-supplied secret.
func (m *Member) rotationGuard() ([]Relay, error) {
	v := m.view(time.Now())
	var fresh []Relay
	var files []string
	for _, r := range m.relays.All() {
		if !v.fresh(r.LastSeenAt) {
			continue
		}
		fresh = append(fresh, r)
		if r.SecretSource == SecretSourceFile {
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

// changeSecretRecord applies change to the stored record with
// compare-and-set and records the event it returns.
func (m *Member) changeSecretRecord(ctx context.Context, by string, change func(*SecretRecord) (Event, bool, error)) (SecretRecordInfo, error) {
	var ev Event
	rec, err := update(ctx, m.fleetKV, SecretRecordKey, func(cur SecretRecord, found bool) (SecretRecord, bool, error) {
		if !found {
			return cur, false, fmt.Errorf("%w: no fleet secret is stored (do the relays run from files?)", ErrRotationRefused)
		}
		if err := cur.validate(); err != nil {
			return cur, false, err
		}
		e, write, err := change(&cur)
		if err != nil || !write {
			return cur, false, err
		}
		cur.Generation++
		cur.UpdatedAt, cur.UpdatedBy = now(), by
		ev = e
		return cur, true, nil
	})
	if err != nil {
		return SecretRecordInfo{}, err
	}
	if ev.Message != "" {
		ev.Type = EventSecretRotation
		m.Record(ev)
	}
	return recordInfo(rec), nil
}

// BeginSecretRotation starts a rotation of the fleet secret, or finds the
// one in progress: a new random secret joins the record as accepted only.
// by says who rotates, for the record and the events.
func (m *Member) BeginSecretRotation(ctx context.Context, by string) (SecretRecordInfo, error) {
	if _, err := m.rotationGuard(); err != nil {
		return SecretRecordInfo{}, err
	}
	return m.changeSecretRecord(ctx, by, func(r *SecretRecord) (Event, bool, error) {
		if r.Rotation != nil {
			return Event{}, false, nil // resume it
		}
		if len(r.Secrets) >= MaxSecrets {
			return Event{}, false, fmt.Errorf("%w: the record holds %d secrets already, old ones kept for their grace; wait until housekeeping drops them", ErrRotationRefused, len(r.Secrets))
		}
		s := secret.New()
		fp := secret.Fingerprint(s)
		t := now()
		r.Secrets = append(r.Secrets, StoredSecret{Fingerprint: fp, Secret: s, AddedAt: t})
		r.Rotation = &Rotation{Phase: RotationAccept, From: r.Signing, To: fp, StartedAt: t, By: by}
		return Event{Message: fmt.Sprintf("secret rotation from %s to %s begun by %s: every relay now accepts %s, none signs with it yet", r.Signing, fp, by, fp)}, true, nil
	})
}

// SignWithNewSecret takes the second step of a rotation: the new secret
// signs. Refused until every fresh relay reports that it accepts it.
func (m *Member) SignWithNewSecret(ctx context.Context, by string) (SecretRecordInfo, error) {
	fresh, err := m.rotationGuard()
	if err != nil {
		return SecretRecordInfo{}, err
	}
	return m.changeSecretRecord(ctx, by, func(r *SecretRecord) (Event, bool, error) {
		rot := r.Rotation
		switch {
		case rot == nil:
			return Event{}, false, fmt.Errorf("%w: no rotation is in progress; begin one first", ErrRotationRefused)
		case rot.Phase == RotationSign:
			return Event{}, false, nil
		}
		if late := relaysWithout(fresh, rot.To, false); len(late) > 0 {
			return Event{}, false, fmt.Errorf("%w: relay(s) %s do not accept the new secret %s yet; signing with it now would break their forwards", ErrRotationRefused, strings.Join(late, ", "), rot.To)
		}
		rot.Phase, r.Signing = RotationSign, rot.To
		return Event{Message: fmt.Sprintf("secret rotation: relays now sign with %s and still accept %s", rot.To, rot.From)}, true, nil
	})
}

// FinishSecretRotation takes the last step of a rotation: the old secret
// is dropped, or kept accepted for grace (housekeeping drops it then).
// Refused until every fresh relay reports signing with the new secret.
func (m *Member) FinishSecretRotation(ctx context.Context, by string, grace time.Duration) (SecretRecordInfo, error) {
	fresh, err := m.rotationGuard()
	if err != nil {
		return SecretRecordInfo{}, err
	}
	return m.changeSecretRecord(ctx, by, func(r *SecretRecord) (Event, bool, error) {
		rot := r.Rotation
		switch {
		case rot == nil:
			return Event{}, false, fmt.Errorf("%w: no rotation is in progress", ErrRotationRefused)
		case rot.Phase != RotationSign:
			return Event{}, false, fmt.Errorf("%w: the new secret %s does not sign yet; take the sign step first", ErrRotationRefused, rot.To)
		}
		if late := relaysWithout(fresh, rot.To, true); len(late) > 0 {
			return Event{}, false, fmt.Errorf("%w: relay(s) %s do not sign with the new secret %s yet; dropping the old one now would break their forwards", ErrRotationRefused, strings.Join(late, ", "), rot.To)
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
		return Event{Message: msg}, true, nil
	})
}

// relaysWithout returns the ids of the relays that do not accept fp, or,
// with signing, do not sign with it.
func relaysWithout(relays []Relay, fp string, signing bool) []string {
	var out []string
	for _, r := range relays {
		if signing && r.SecretFingerprint != fp || !signing && !slices.Contains(r.SecretAccepted, fp) {
			out = append(out, r.ID)
		}
	}
	slices.Sort(out)
	return out
}

// retireSecrets drops, for the lease holder, the old secrets whose grace
// ended.
func (m *Member) retireSecrets(ctx context.Context, t time.Time) {
	rec, ok := m.secretRec.Get(SecretRecordKey)
	if !ok || !slices.ContainsFunc(rec.Secrets, func(s StoredSecret) bool { return retired(rec, s, t) }) {
		return
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	_, _ = m.changeSecretRecord(octx, m.cfg.RelayID, func(r *SecretRecord) (Event, bool, error) {
		var gone []string
		r.Secrets = slices.DeleteFunc(r.Secrets, func(s StoredSecret) bool {
			if retired(*r, s, t) {
				gone = append(gone, s.Fingerprint)
				return true
			}
			return false
		})
		if len(gone) == 0 {
			return Event{}, false, nil
		}
		return Event{Message: fmt.Sprintf("old fleet secret(s) %s dropped: their grace after a rotation ended", strings.Join(gone, ", "))}, true, nil
	})
}

// retired reports whether s is an old secret of r whose grace ended by t.
func retired(r SecretRecord, s StoredSecret, t time.Time) bool {
	inRotation := r.Rotation != nil && (s.Fingerprint == r.Rotation.From || s.Fingerprint == r.Rotation.To)
	return !s.RetireAt.IsZero() && t.After(s.RetireAt) && s.Fingerprint != r.Signing && !inRotation
}
