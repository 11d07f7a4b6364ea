package fleet

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestSecretParity(t *testing.T) {
	rel := func(id, signs, source string, accepts ...string) Relay {
		return Relay{ID: id, SecretFingerprint: signs, SecretSource: source, SecretAccepted: append([]string{signs}, accepts...)}
	}
	rec := &SecretRecord{Signing: "aa"}
	inSign := &SecretRecord{Signing: "bb", Rotation: &Rotation{Phase: RotationSign, From: "aa", To: "bb"}}
	inAccept := &SecretRecord{Signing: "aa", Rotation: &Rotation{Phase: RotationAccept, From: "aa", To: "bb"}}
	tests := []struct {
		name     string
		relays   []Relay
		rec      *SecretRecord
		expected string
		basis    string
		odd      []string
		signing  int
	}{
		{"parity", []Relay{rel("r1", "aa", "fleet"), rel("r2", "aa", "fleet")}, rec, "aa", ParityRecord, nil, 1},
		{"one odd by file", []Relay{rel("r1", "aa", "fleet"), rel("r2", "aa", "fleet"), rel("r3", "cc", "file")}, rec, "aa", ParityRecord, []string{"r3"}, 2},
		// The record decides even against a majority of files.
		{"record beats files", []Relay{rel("r1", "aa", "fleet"), rel("r2", "cc", "file"), rel("r3", "cc", "file")}, rec, "aa", ParityRecord, []string{"r2", "r3"}, 2},
		{"files only: majority", []Relay{rel("r1", "cc", "file"), rel("r2", "cc", "file"), rel("r3", "dd", "file")}, rec, "cc", ParityMajority, []string{"r3"}, 2},
		{"no record: majority", []Relay{rel("r1", "cc", "fleet"), rel("r2", "dd", "file"), rel("r3", "dd", "file")}, nil, "dd", ParityMajority, []string{"r1"}, 2},
		{"a tie goes to the smallest", []Relay{rel("r1", "dd", "file"), rel("r2", "cc", "file")}, nil, "cc", ParityMajority, []string{"r1"}, 2},
		// Signing with the expected secret is not enough: a relay must
		// also accept it, or the others' forwards to it fail.
		{"signs right, accepts wrong", []Relay{rel("r1", "aa", "fleet"), {ID: "r2", SecretFingerprint: "aa", SecretSource: "file", SecretAccepted: []string{"cc"}}}, rec, "aa", ParityRecord, []string{"r2"}, 1},
		{"accepting more is fine", []Relay{rel("r1", "aa", "fleet", "zz"), rel("r2", "aa", "file", "yy")}, rec, "aa", ParityRecord, nil, 1},
		// During a rotation's sign phase a relay that has not applied the
		// record yet still signs with the old secret: not odd.
		{"sign phase", []Relay{rel("r1", "bb", "fleet", "aa"), rel("r2", "aa", "fleet", "bb")}, inSign, "bb", ParityRecord, nil, 2},
		{"sign phase, one never accepted", []Relay{rel("r1", "bb", "fleet", "aa"), rel("r2", "aa", "fleet")}, inSign, "bb", ParityRecord, []string{"r2"}, 2},
		{"accept phase", []Relay{rel("r1", "aa", "fleet", "bb"), rel("r2", "aa", "fleet")}, inAccept, "aa", ParityRecord, nil, 1},
		// Relays that report no secret are left out, as are stale ones.
		{"no secret reported", []Relay{rel("r1", "aa", "fleet"), {ID: "old"}}, rec, "aa", ParityRecord, nil, 1},
		{"stale", []Relay{rel("r1", "aa", "fleet"), rel("stale", "cc", "file")}, rec, "aa", ParityRecord, nil, 1},
		{"nobody", []Relay{{ID: "old"}}, rec, "", "", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := secretParity(tt.relays, func(r Relay) bool { return r.ID != "stale" }, tt.rec)
			if p.Expected != tt.expected || p.Basis != tt.basis || !slices.Equal(p.Odd, append([]string{}, tt.odd...)) || p.SigningFingerprints != tt.signing {
				t.Fatalf("parity = %+v, want expected %q basis %q odd %v signing %d", p, tt.expected, tt.basis, tt.odd, tt.signing)
			}
			if p.Odd == nil {
				t.Fatal("Odd is nil, want [] when none")
			}
		})
	}
}

func TestParseSecretFile(t *testing.T) {
	a, b := secret.New(), secret.New()
	b64 := base64.StdEncoding.EncodeToString(a)
	good := []struct {
		name string
		text string
		want [][]byte
	}{
		{"base64", b64 + "\n", [][]byte{a}},
		{"base64 without padding", strings.TrimRight(b64, "="), [][]byte{a}},
		{"hex", hex.EncodeToString(a), [][]byte{a}},
		{"hex signs, base64 accepted, comments", "# the fleet secret\n\n  " + hex.EncodeToString(b) + "  \r\n" + b64 + "\n# old\n", [][]byte{b, a}},
	}
	for _, tt := range good {
		keys, err := parseSecretFile([]byte(tt.text))
		if err != nil || len(keys) != len(tt.want) {
			t.Fatalf("%s: %d keys, %v", tt.name, len(keys), err)
		}
		for i := range keys {
			if string(keys[i]) != string(tt.want[i]) {
				t.Errorf("%s: key %d differs", tt.name, i)
			}
		}
	}
	bad := []struct{ text, want string }{
		{"", "no secret in the file"},
		{"# only a comment\n", "no secret in the file"},
		{"c2hvcnQ=", "line 1: a secret of 5 bytes is too short"},
		{b64 + "\nnot base64 at all!\n", "line 2: neither hex nor standard base64"},
		{strings.Repeat(b64+"\n", MaxSecrets+1), "at most 8"},
	}
	for _, tt := range bad {
		_, err := parseSecretFile([]byte(tt.text))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want %q", tt.text, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), b64) {
			t.Errorf("an error shows the secret: %v", err)
		}
	}
}

// fleetKV opens the test fleet's BucketFleet on a connection of the test's own.
func (f *testFleet) fleetKV() jetstream.KeyValue {
	f.t.Helper()
	st, err := store.Open(testContext(f.t), store.Config{URLs: f.urls})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { st.Close() })
	kv, err := st.KeyValue(testContext(f.t), BucketFleet)
	if err != nil {
		f.t.Fatal(err)
	}
	return kv
}

func storedRecord(t *testing.T, kv jetstream.KeyValue) SecretRecord {
	t.Helper()
	e, err := kv.Get(testContext(t), SecretRecordKey)
	if err != nil {
		t.Fatal(err)
	}
	var rec SecretRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestNewFleetSecret starts members in an empty fleet: the first stores a
// new secret as the record, and nothing else: no raw secret lies in NATS
// beside it.
func TestNewFleetSecret(t *testing.T) {
	f := newTestFleet(t)
	a, b := f.join(), f.join()
	kv := f.fleetKV()
	rec := storedRecord(t, kv)
	if rec.Format != SecretRecordFormat || rec.Generation != 1 || len(rec.Secrets) != 1 {
		t.Fatalf("stored record %+v", rec)
	}
	keys, err := kv.Keys(testContext(t))
	if err != nil || !slices.Equal(keys, []string{SecretRecordKey}) {
		t.Fatalf("the fleet bucket holds %v (%v), want only %s", keys, err, SecretRecordKey)
	}
	if a.m.Secrets().Fingerprint() != rec.Signing || b.m.Secrets().Fingerprint() != rec.Signing {
		t.Fatal("the members run another secret than the stored one")
	}
	if a.m.SecretSource() != SecretSourceFleet {
		t.Errorf("source %q", a.m.SecretSource())
	}
	// A record lost with its NATS files is put back from what the
	// members run.
	if err := kv.Delete(testContext(t), SecretRecordKey); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		e, err := kv.Get(testContext(t), SecretRecordKey)
		if err != nil {
			return err
		}
		var back SecretRecord
		if err := json.Unmarshal(e.Value(), &back); err != nil || back.Signing != rec.Signing {
			return fmt.Errorf("put back as %+v, %v", back, err)
		}
		return nil
	})
}

// waitReports waits until every member sees every member report a secret
// that satisfies ok.
func waitReports(t *testing.T, nodes []*node, what string, ok func(RelayStatus) bool) {
	t.Helper()
	eventually(t, 5*time.Second, func() error {
		for _, n := range nodes {
			rs := n.m.Relays()
			if len(rs) != len(nodes) {
				return fmt.Errorf("%d relays", len(rs))
			}
			for _, r := range rs {
				if !ok(r) {
					return fmt.Errorf("relay %s does not %s: it signs with %s, accepts %v", r.ID, what, r.SecretFingerprint, r.SecretAccepted)
				}
			}
		}
		return nil
	})
}

// TestSecretRotation walks a rotation step by step on three members: each
// step is refused until every relay reports the previous one, and the old
// secret is dropped when its grace ends.
func TestSecretRotation(t *testing.T) {
	f := newTestFleet(t)
	nodes := []*node{f.join(), f.join(), f.join()}
	a := nodes[0]
	ctx := testContext(t)
	from := a.m.Secrets().Fingerprint()
	waitReports(t, nodes, "sign with the first secret", func(r RelayStatus) bool { return r.SecretFingerprint == from })

	if _, err := a.m.SignWithNewSecret(ctx, "test"); !errors.Is(err, ErrRotationRefused) {
		t.Fatalf("sign without a rotation: %v", err)
	}
	info, err := a.m.BeginSecretRotation(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	rot := info.Rotation
	if rot == nil || rot.Phase != RotationAccept || rot.From != from || rot.To == from || info.Signing != from || len(info.Secrets) != 2 {
		t.Fatalf("begin: %+v", info)
	}
	// Beginning again finds the same rotation.
	if again, err := a.m.BeginSecretRotation(ctx, "test"); err != nil || again.Rotation == nil || again.Rotation.To != rot.To {
		t.Fatalf("begin again: %+v, %v", again, err)
	}
	if _, err := a.m.FinishSecretRotation(ctx, "test", 0); !errors.Is(err, ErrRotationRefused) {
		t.Fatalf("finish before sign: %v", err)
	}
	waitReports(t, nodes, "accept the new secret", func(r RelayStatus) bool {
		return r.SecretFingerprint == from && slices.Contains(r.SecretAccepted, rot.To)
	})
	if _, err := a.m.SignWithNewSecret(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	waitReports(t, nodes, "sign with the new secret", func(r RelayStatus) bool {
		return r.SecretFingerprint == rot.To && slices.Contains(r.SecretAccepted, from)
	})
	kv := f.fleetKV()
	if _, err := a.m.FinishSecretRotation(ctx, "test", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	rec := storedRecord(t, kv)
	if rec.Rotation != nil || rec.Signing != rot.To || len(rec.Secrets) != 2 {
		t.Fatalf("after finish: %+v", rec)
	}
	// Housekeeping drops the old secret when its grace ends.
	waitReports(t, nodes, "accept only the new secret", func(r RelayStatus) bool {
		return r.SecretFingerprint == rot.To && slices.Equal(r.SecretAccepted, []string{rot.To})
	})
	for _, typ := range []string{"begun", "now sign with", "stays accepted until", "dropped"} {
		waitEvent(t, a.m, 5*time.Second, func(e Event) bool { return e.Type == EventSecretRotation && strings.Contains(e.Message, typ) })
	}
	if p := a.m.SecretParity(); len(p.Odd) != 0 || p.Expected != rot.To {
		t.Fatalf("parity after the rotation: %+v", p)
	}
}

// gauge returns the value of the metric name with the given relay label
// ("" for none) from reg, and whether it is there.
func gauge(t *testing.T, reg *prometheus.Registry, name, relay string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			label := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "relay" {
					label = l.GetValue()
				}
			}
			if label == relay {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestSecretFileParity runs a member from a file with another secret than
// the stored one: it is odd, by event, metric, status and routing, and no
// rotation starts while it runs; fixing its file heals parity.
func TestSecretFileParity(t *testing.T) {
	f := newTestFleet(t)
	a, b := f.join(), f.join()
	path := filepath.Join(t.TempDir(), "fleet.secret")
	wrong := secret.New()
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(wrong)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &testkit.Buffer{}
	c := f.join(func(cfg *Config) {
		cfg.SecretFile = path
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	if c.m.SecretSource() != SecretSourceFile || c.m.Secrets().Fingerprint() != secret.Fingerprint(wrong) {
		t.Fatalf("the file member runs %s from %s", c.m.Secrets().Fingerprint(), c.m.SecretSource())
	}
	reg := prometheus.NewRegistry()
	b.m.RegisterMetrics(reg)
	odd := c.m.ID()

	e := waitEvent(t, a.m, 5*time.Second, func(e Event) bool { return e.Type == EventSecretMismatch && e.RelayID == odd })
	if !strings.Contains(e.Message, secret.Fingerprint(wrong)) || !strings.Contains(e.Message, a.m.Secrets().Fingerprint()) {
		t.Errorf("the mismatch event names neither fingerprint: %s", e.Message)
	}
	eventually(t, 5*time.Second, func() error {
		if v, ok := gauge(t, reg, "switchboard_fleet_secret_mismatch", odd); !ok || v != 1 {
			return fmt.Errorf("mismatch{%s} = %v (%v)", odd, v, ok)
		}
		if v, ok := gauge(t, reg, "switchboard_fleet_secret_mismatch", a.m.ID()); !ok || v != 0 {
			return fmt.Errorf("mismatch{%s} = %v (%v)", a.m.ID(), v, ok)
		}
		if v, _ := gauge(t, reg, "switchboard_fleet_secret_fingerprints", ""); v != 2 {
			return fmt.Errorf("fingerprints = %v", v)
		}
		if st := b.m.Status(); !slices.Equal(st.SecretMismatch, []string{odd}) {
			return fmt.Errorf("status mismatch %v", st.SecretMismatch)
		}
		// Routing: nothing is placed on the odd relay, and neither side
		// forwards to the other.
		if !a.m.SecretOdd(odd) || !a.m.SecretRefuses(odd) || !c.m.SecretRefuses(a.m.ID()) || !c.m.SecretOdd(odd) {
			return errors.New("routing does not see the odd relay yet")
		}
		return nil
	})
	if a.m.SecretOdd(b.m.ID()) || a.m.SecretRefuses(b.m.ID()) {
		t.Error("a relay in parity is avoided")
	}
	if _, err := a.m.BeginSecretRotation(testContext(t), "test"); !errors.Is(err, ErrRotationRefused) || !strings.Contains(err.Error(), odd) {
		t.Fatalf("a rotation with a file member: %v", err)
	}

	// Fix the file: the stored secret, with the wrong one still accepted.
	rec := storedRecord(t, f.fleetKV())
	good, _ := rec.secretOf(rec.Signing)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(good)+"\n"+base64.StdEncoding.EncodeToString(wrong)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e = waitEvent(t, a.m, 5*time.Second, func(e Event) bool { return e.Type == EventSecretParity && e.RelayID == odd })
	if !strings.Contains(e.Message, "every fresh relay runs the fleet's secret") {
		t.Errorf("parity event: %s", e.Message)
	}
	eventually(t, 5*time.Second, func() error {
		if v, _ := gauge(t, reg, "switchboard_fleet_secret_mismatch", odd); v != 0 {
			return fmt.Errorf("mismatch{%s} = %v", odd, v)
		}
		if a.m.SecretOdd(odd) || a.m.SecretRefuses(odd) || c.m.SecretRefuses(a.m.ID()) {
			return errors.New("routing still avoids the fixed relay")
		}
		return nil
	})
	// A broken file leaves the running secret alone.
	if err := os.WriteFile(path, []byte("garbage!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		if logs.Count("the fleet secret file cannot be used") == 1 {
			return nil
		}
		return errors.New("the broken file was not reported")
	})
	if c.m.Secrets().Fingerprint() != rec.Signing {
		t.Fatal("a broken file changed the running secret")
	}
}

// TestSecretFileAtStart refuses to start from a file that holds no usable
// secret, saying which line.
func TestSecretFileAtStart(t *testing.T) {
	f := newTestFleet(t)
	path := filepath.Join(t.TempDir(), "fleet.secret")
	if err := os.WriteFile(path, []byte("c2hvcnQ=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(testContext(t), store.Config{URLs: f.urls})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := f.base
	cfg.RelayID, cfg.Local, cfg.SecretFile = "rl-0000f11e", &fakeLocal{}, path
	m, err := Open(testContext(t), st, cfg)
	if err == nil {
		m.Close()
		t.Fatal("a member started from a file with a 5-byte secret")
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("error %v names neither the file nor the line", err)
	}
}
