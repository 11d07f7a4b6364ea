package fleetsecret

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

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestSecretParity(t *testing.T) {
	rel := func(id, signs, source string, accepts ...string) fleet.RelayStatus {
		return fleet.RelayStatus{ID: id, SecretFingerprint: signs, SecretSource: source, SecretAccepted: append([]string{signs}, accepts...)}
	}
	rec := &Record{Signing: "aa"}
	inSign := &Record{Signing: "bb", Rotation: &Rotation{Phase: RotationSign, From: "aa", To: "bb"}}
	inAccept := &Record{Signing: "aa", Rotation: &Rotation{Phase: RotationAccept, From: "aa", To: "bb"}}
	tests := []struct {
		name     string
		relays   []fleet.RelayStatus
		rec      *Record
		expected string
		basis    string
		odd      []string
		signing  int
	}{
		{"parity", []fleet.RelayStatus{rel("r1", "aa", "fleet"), rel("r2", "aa", "fleet")}, rec, "aa", ParityRecord, nil, 1},
		{"one odd by file", []fleet.RelayStatus{rel("r1", "aa", "fleet"), rel("r2", "aa", "fleet"), rel("r3", "cc", "file")}, rec, "aa", ParityRecord, []string{"r3"}, 2},
		// The record decides even against a majority of files.
		{"record beats files", []fleet.RelayStatus{rel("r1", "aa", "fleet"), rel("r2", "cc", "file"), rel("r3", "cc", "file")}, rec, "aa", ParityRecord, []string{"r2", "r3"}, 2},
		{"files only: majority", []fleet.RelayStatus{rel("r1", "cc", "file"), rel("r2", "cc", "file"), rel("r3", "dd", "file")}, rec, "cc", ParityMajority, []string{"r3"}, 2},
		{"no record: majority", []fleet.RelayStatus{rel("r1", "cc", "fleet"), rel("r2", "dd", "file"), rel("r3", "dd", "file")}, nil, "dd", ParityMajority, []string{"r1"}, 2},
		{"a tie goes to the smallest", []fleet.RelayStatus{rel("r1", "dd", "file"), rel("r2", "cc", "file")}, nil, "cc", ParityMajority, []string{"r1"}, 2},
		// Signing with the expected secret is not enough: a relay must
		// also accept it, or the others' forwards to it fail.
		{"signs right, accepts wrong", []fleet.RelayStatus{rel("r1", "aa", "fleet"), {ID: "r2", SecretFingerprint: "aa", SecretSource: "file", SecretAccepted: []string{"cc"}}}, rec, "aa", ParityRecord, []string{"r2"}, 1},
		{"accepting more is fine", []fleet.RelayStatus{rel("r1", "aa", "fleet", "zz"), rel("r2", "aa", "file", "yy")}, rec, "aa", ParityRecord, nil, 1},
		// During a rotation's sign phase a relay that has not applied the
		// record yet still signs with the old secret: not odd.
		{"sign phase", []fleet.RelayStatus{rel("r1", "bb", "fleet", "aa"), rel("r2", "aa", "fleet", "bb")}, inSign, "bb", ParityRecord, nil, 2},
		{"sign phase, one never accepted", []fleet.RelayStatus{rel("r1", "bb", "fleet", "aa"), rel("r2", "aa", "fleet")}, inSign, "bb", ParityRecord, []string{"r2"}, 2},
		{"accept phase", []fleet.RelayStatus{rel("r1", "aa", "fleet", "bb"), rel("r2", "aa", "fleet")}, inAccept, "aa", ParityRecord, nil, 1},
		// Relays that report no secret are left out, as are stale ones.
		{"no secret reported", []fleet.RelayStatus{rel("r1", "aa", "fleet"), {ID: "old"}}, rec, "aa", ParityRecord, nil, 1},
		{"stale", []fleet.RelayStatus{rel("r1", "aa", "fleet"), rel("stale", "cc", "file")}, rec, "aa", ParityRecord, nil, 1},
		{"nobody", []fleet.RelayStatus{{ID: "old"}}, rec, "", "", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tt.relays {
				tt.relays[i].Fresh = tt.relays[i].ID != "stale"
			}
			p := parity(tt.relays, tt.rec)
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
		keys, err := parseFile([]byte(tt.text))
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
		_, err := parseFile([]byte(tt.text))
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
	kv, err := st.KeyValue(testContext(f.t), fleet.BucketFleet)
	if err != nil {
		f.t.Fatal(err)
	}
	return kv
}

func storedRecord(t *testing.T, kv jetstream.KeyValue) Record {
	t.Helper()
	e, err := kv.Get(testContext(t), RecordKey)
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
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
	if rec.Format != RecordFormat || rec.Generation != 1 || len(rec.Secrets) != 1 {
		t.Fatalf("stored record %+v", rec)
	}
	keys, err := kv.Keys(testContext(t))
	if err != nil || !slices.Equal(keys, []string{RecordKey}) {
		t.Fatalf("the fleet bucket holds %v (%v), want only %s", keys, err, RecordKey)
	}
	if a.k.Ring().Fingerprint() != rec.Signing || b.k.Ring().Fingerprint() != rec.Signing {
		t.Fatal("the members run another secret than the stored one")
	}
	if a.k.Source() != SourceFleet {
		t.Errorf("source %q", a.k.Source())
	}
	// A record lost with its NATS files is put back from what the
	// members run.
	if err := kv.Delete(testContext(t), RecordKey); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		e, err := kv.Get(testContext(t), RecordKey)
		if err != nil {
			return err
		}
		var back Record
		if err := json.Unmarshal(e.Value(), &back); err != nil || back.Signing != rec.Signing {
			return fmt.Errorf("put back as %+v, %v", back, err)
		}
		return nil
	})
}

// waitReports waits until every member sees every member report a secret
// that satisfies ok.
func waitReports(t *testing.T, nodes []*node, what string, ok func(fleet.RelayStatus) bool) {
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
	from := a.k.Ring().Fingerprint()
	waitReports(t, nodes, "sign with the first secret", func(r fleet.RelayStatus) bool { return r.SecretFingerprint == from })

	if _, err := a.k.SignWithNew(ctx, "test"); !errors.Is(err, ErrRotationRefused) {
		t.Fatalf("sign without a rotation: %v", err)
	}
	info, err := a.k.BeginRotation(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	rot := info.Rotation
	if rot == nil || rot.Phase != RotationAccept || rot.From != from || rot.To == from || info.Signing != from || len(info.Secrets) != 2 {
		t.Fatalf("begin: %+v", info)
	}
	// Beginning again finds the same rotation.
	if again, err := a.k.BeginRotation(ctx, "test"); err != nil || again.Rotation == nil || again.Rotation.To != rot.To {
		t.Fatalf("begin again: %+v, %v", again, err)
	}
	if _, err := a.k.FinishRotation(ctx, "test", 0); !errors.Is(err, ErrRotationRefused) {
		t.Fatalf("finish before sign: %v", err)
	}
	waitReports(t, nodes, "accept the new secret", func(r fleet.RelayStatus) bool {
		return r.SecretFingerprint == from && slices.Contains(r.SecretAccepted, rot.To)
	})
	if _, err := a.k.SignWithNew(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	waitReports(t, nodes, "sign with the new secret", func(r fleet.RelayStatus) bool {
		return r.SecretFingerprint == rot.To && slices.Contains(r.SecretAccepted, from)
	})
	kv := f.fleetKV()
	if _, err := a.k.FinishRotation(ctx, "test", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	rec := storedRecord(t, kv)
	if rec.Rotation != nil || rec.Signing != rot.To || len(rec.Secrets) != 2 {
		t.Fatalf("after finish: %+v", rec)
	}
	// Housekeeping drops the old secret when its grace ends.
	waitReports(t, nodes, "accept only the new secret", func(r fleet.RelayStatus) bool {
		return r.SecretFingerprint == rot.To && slices.Equal(r.SecretAccepted, []string{rot.To})
	})
	for _, typ := range []string{"begun", "now sign with", "stays accepted until", "dropped"} {
		waitEvent(t, a.m, 5*time.Second, func(e fleet.Event) bool {
			return e.Type == fleet.EventSecretRotation && strings.Contains(e.Message, typ)
		})
	}
	if p := a.k.Parity(); len(p.Odd) != 0 || p.Expected != rot.To {
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
		cfg.File = path
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	if c.k.Source() != SourceFile || c.k.Ring().Fingerprint() != secret.Fingerprint(wrong) {
		t.Fatalf("the file member runs %s from %s", c.k.Ring().Fingerprint(), c.k.Source())
	}
	reg := prometheus.NewRegistry()
	b.k.RegisterMetrics(reg)
	odd := c.m.ID()

	e := waitEvent(t, a.m, 5*time.Second, func(e fleet.Event) bool { return e.Type == fleet.EventSecretMismatch && e.RelayID == odd })
	if !strings.Contains(e.Message, secret.Fingerprint(wrong)) || !strings.Contains(e.Message, a.k.Ring().Fingerprint()) {
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
		if p := b.k.Parity(); !slices.Equal(p.Odd, []string{odd}) {
			return fmt.Errorf("parity odd %v", p.Odd)
		}
		// Routing: nothing is placed on the odd relay, and neither side
		// forwards to the other.
		if !a.k.Odd(odd) || !a.k.Refuses(odd) || !c.k.Refuses(a.m.ID()) || !c.k.Odd(odd) {
			return errors.New("routing does not see the odd relay yet")
		}
		return nil
	})
	if a.k.Odd(b.m.ID()) || a.k.Refuses(b.m.ID()) {
		t.Error("a relay in parity is avoided")
	}
	if _, err := a.k.BeginRotation(testContext(t), "test"); !errors.Is(err, ErrRotationRefused) || !strings.Contains(err.Error(), odd) {
		t.Fatalf("a rotation with a file member: %v", err)
	}

	// Fix the file: the stored secret, with the wrong one still accepted.
	rec := storedRecord(t, f.fleetKV())
	good, _ := rec.secretOf(rec.Signing)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(good)+"\n"+base64.StdEncoding.EncodeToString(wrong)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e = waitEvent(t, a.m, 5*time.Second, func(e fleet.Event) bool { return e.Type == fleet.EventSecretParity && e.RelayID == odd })
	if !strings.Contains(e.Message, "every fresh relay runs the fleet's secret") {
		t.Errorf("parity event: %s", e.Message)
	}
	eventually(t, 5*time.Second, func() error {
		if v, _ := gauge(t, reg, "switchboard_fleet_secret_mismatch", odd); v != 0 {
			return fmt.Errorf("mismatch{%s} = %v", odd, v)
		}
		if a.k.Odd(odd) || a.k.Refuses(odd) || c.k.Refuses(a.m.ID()) {
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
	if c.k.Ring().Fingerprint() != rec.Signing {
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
	_, err := f.open(func(c *Config) { c.File = path })
	if err == nil {
		t.Fatal("a keeper started from a file with a 5-byte secret")
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("error %v names neither the file nor the line", err)
	}
}
