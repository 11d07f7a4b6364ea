package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleetsecret"
)

func TestCtlSecretArgumentErrors(t *testing.T) {
	checkArgumentErrors(t, []argumentError{
		{[]string{"secret"}, "ctl secret: no command given; use status or rotate"},
		{[]string{"secret", "show"}, `ctl secret: unknown command "show"; use status or rotate`},
		{[]string{"secret", "status", "extra"}, `switchboard ctl secret status: unexpected argument "extra"`},
		{[]string{"secret", "rotate", "--grace", "-1s"}, "ctl secret rotate: --grace -1s: give 0 to 720h0m0s"},
		{[]string{"secret", "rotate", "--poll", "0s"}, "ctl secret rotate: --timeout and --poll must be positive"},
	})
}

// secretFleet is a fake fleet secret: three relays that apply each step of
// a rotation as soon as it is taken, unless lagging names one that never
// does. Its begin step refuses as the relays' guard does (a fresh relay
// runs from a file), or with refusal when set.
type secretFleet struct {
	mu      sync.Mutex // guards the fields below
	rec     fleetsecret.RecordInfo
	relays  []fleetsecret.RelaySecret
	lagging string
	refusal string
	steps   []string
}

var _ control.FleetSecret = (*secretFleet)(nil)

func newSecretFleet() *secretFleet {
	sf := &secretFleet{rec: fleetsecret.RecordInfo{Generation: 3, Signing: "aaaa", Secrets: []fleetsecret.SecretInfo{{Fingerprint: "aaaa"}}, UpdatedBy: "rl-0000000a"}}
	for _, id := range []string{"rl-0000000a", "rl-0000000b", "rl-0000000c"} {
		sf.relays = append(sf.relays, fleetsecret.RelaySecret{ID: id, Fresh: true, SecretSource: fleetsecret.SourceFleet, SecretFingerprint: "aaaa", SecretAccepted: []string{"aaaa"}})
	}
	return sf
}

func (s *secretFleet) Status() fleetsecret.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.rec
	st := fleetsecret.Status{RelayID: "rl-0000000a", Source: fleetsecret.SourceFleet, Record: &rec, Relays: append([]fleetsecret.RelaySecret(nil), s.relays...),
		Parity: fleetsecret.Parity{Expected: rec.Signing, Basis: fleetsecret.ParityRecord, Odd: []string{}, SigningFingerprints: 1}}
	return st
}

// apply makes every relay but the lagging one run the record.
func (s *secretFleet) applyLocked() {
	var acc []string
	for _, x := range s.rec.Secrets {
		acc = append(acc, x.Fingerprint)
	}
	for i := range s.relays {
		if s.relays[i].ID != s.lagging {
			s.relays[i].SecretFingerprint, s.relays[i].SecretAccepted = s.rec.Signing, acc
		}
	}
}

func (s *secretFleet) BeginRotation(_ context.Context, by string) (fleetsecret.RecordInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.relays {
		if r.Fresh && r.SecretSource == fleetsecret.SourceFile {
			return fleetsecret.RecordInfo{}, fmt.Errorf("%w: relay(s) %s run a fleet secret from --fleet-secret-file, which a rotation cannot change", fleetsecret.ErrRotationRefused, r.ID)
		}
	}
	if s.refusal != "" {
		return fleetsecret.RecordInfo{}, fmt.Errorf("%w: %s", fleetsecret.ErrRotationRefused, s.refusal)
	}
	s.steps = append(s.steps, "begin by "+by)
	if s.rec.Rotation == nil {
		s.rec.Secrets = append(s.rec.Secrets, fleetsecret.SecretInfo{Fingerprint: "bbbb"})
		s.rec.Rotation = &fleetsecret.Rotation{Phase: fleetsecret.RotationAccept, From: "aaaa", To: "bbbb"}
		s.applyLocked()
	}
	return s.rec, nil
}

func (s *secretFleet) SignWithNew(context.Context, string) (fleetsecret.RecordInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, "sign")
	if s.lagging != "" {
		return s.rec, fmt.Errorf("%w: relay(s) %s do not accept the new secret bbbb yet", fleetsecret.ErrRotationRefused, s.lagging)
	}
	s.rec.Signing, s.rec.Rotation.Phase = "bbbb", fleetsecret.RotationSign
	s.applyLocked()
	return s.rec, nil
}

func (s *secretFleet) FinishRotation(_ context.Context, _ string, grace time.Duration) (fleetsecret.RecordInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, fmt.Sprintf("finish %s", grace))
	s.rec.Secrets, s.rec.Rotation = []fleetsecret.SecretInfo{{Fingerprint: "bbbb"}}, nil
	s.applyLocked()
	return s.rec, nil
}

// Parity is the parity Status reports.
func (s *secretFleet) Parity() fleetsecret.Parity { return s.Status().Parity }

// Report is what the answering relay reports on its beats.
func (s *secretFleet) Report() (string, []string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.relays[0]
	return r.SecretFingerprint, r.SecretAccepted, r.SecretSource
}

func secretFixture(t *testing.T) (*ctlFixture, *secretFleet) {
	t.Helper()
	f, sf := newCtlFixture(t), newSecretFleet()
	srv := httptest.NewServer(control.NewHandler(control.Config{Tokens: f.tokens, Fleet: newFakeFleet(), Secret: sf}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f, sf
}

func TestCtlSecretStatus(t *testing.T) {
	f, sf := secretFixture(t)
	out, _ := f.mustCtl(t, "secret", "status")
	for _, want := range []string{"signs with aaaa (generation 3", "rotation       none in progress", "parity         ok: every fresh relay runs aaaa (record)",
		"RELAY        FRESH  SOURCE  SIGNS  ACCEPTS  ODD", "rl-0000000b  yes    fleet   aaaa   aaaa     no"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	js, _ := f.mustCtl(t, "secret", "status", "-o", "json")
	var st control.SecretStatus
	if err := json.Unmarshal([]byte(js), &st); err != nil || st.Record == nil || st.Record.Signing != "aaaa" || len(st.Relays) != 3 {
		t.Fatalf("status -o json = %s (%v)", js, err)
	}
	for _, field := range []string{`"relay_id"`, `"source"`, `"record"`, `"parity"`, `"relays"`, `"secret_fingerprint"`, `"secret_accepted"`, `"odd"`, `"expected"`, `"basis"`, `"signing_fingerprints"`, `"rotation": null`} {
		if !strings.Contains(js, field) {
			t.Errorf("status -o json lacks %s", field)
		}
	}
	sf.mu.Lock()
	sf.relays[2].SecretSource = fleetsecret.SourceFile
	sf.mu.Unlock()
	_, stderr, err := f.ctl(t, "secret", "rotate")
	if !errors.Is(err, errRotationRefused) || !strings.Contains(err.Error(), "rl-0000000c run a fleet secret from --fleet-secret-file") {
		t.Fatalf("rotate with a file-supplied relay: %v %s", err, stderr)
	}
	if len(sf.steps) != 0 {
		t.Fatalf("a refused rotation took steps %v", sf.steps)
	}
}

func TestCtlSecretRotate(t *testing.T) {
	f, sf := secretFixture(t)
	out, _ := f.mustCtl(t, "secret", "rotate", "--poll", "5ms", "--grace", "90m")
	for _, want := range []string{"begin     added the new secret bbbb, accepted only; relays still sign with aaaa",
		"waiting   3 of 3 fresh relays accept bbbb", "sign      relays now sign with bbbb; aaaa is still accepted",
		"waiting   3 of 3 fresh relays sign with bbbb", "done      rotated: relays sign with bbbb; aaaa stays accepted for 1h30m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("rotate printed no %q:\n%s", want, out)
		}
	}
	if got := strings.Join(sf.steps, ", "); !strings.HasPrefix(got, "begin by ") || !strings.HasSuffix(got, ", sign, finish 1h30m0s") {
		t.Errorf("steps %s", got)
	}

	// A relay that never accepts: the wait gives up, saying who and how to
	// go on; the rotation stays where it was.
	f, sf = secretFixture(t)
	sf.lagging = "rl-0000000b"
	out, _, err := f.ctl(t, "-o", "json", "secret", "rotate", "--poll", "5ms", "--timeout", "50ms")
	if err == nil || !strings.Contains(err.Error(), "relay(s) rl-0000000b did not accept bbbb within 50ms; the rotation stays recorded at phase accept") {
		t.Fatalf("rotate with a lagging relay: %v", err)
	}
	var step rotationStep
	first, _, _ := strings.Cut(out, "\n")
	if err := json.Unmarshal([]byte(first), &step); err != nil || step.Phase != "begin" || step.From != "aaaa" || step.To != "bbbb" {
		t.Fatalf("first -o json line %q (%v)", first, err)
	}
	// The relays' own check refuses the sign step too (409): said as such.
	sf.mu.Lock()
	sf.rec.Rotation.Phase = fleetsecret.RotationAccept
	sf.relays[1].SecretAccepted = []string{"aaaa", "bbbb"}
	sf.mu.Unlock()
	_, _, err = f.ctl(t, "secret", "rotate", "--poll", "5ms", "--timeout", "50ms")
	if !errors.Is(err, errRotationRefused) || !strings.Contains(err.Error(), "rotation refused: relay(s) rl-0000000b do not accept the new secret bbbb yet") {
		t.Fatalf("a refused sign step: %v", err)
	}
}

// TestCtlSecretRotateAsksTheRelay: a rotation in progress is resumed only
// past the relay's guards, as a new one begins: the begin step is asked
// every time, and its refusal stops the command before any other step.
func TestCtlSecretRotateAsksTheRelay(t *testing.T) {
	f, sf := secretFixture(t)
	sf.mu.Lock()
	sf.rec.Secrets = append(sf.rec.Secrets, fleetsecret.SecretInfo{Fingerprint: "bbbb"})
	sf.rec.Rotation = &fleetsecret.Rotation{Phase: fleetsecret.RotationAccept, From: "aaaa", To: "bbbb"}
	sf.applyLocked()
	sf.refusal = "the relays cannot follow a rotation now"
	sf.mu.Unlock()
	_, _, err := f.ctl(t, "secret", "rotate", "--poll", "5ms", "--timeout", "50ms")
	if !errors.Is(err, errRotationRefused) || !strings.Contains(err.Error(), "rotation refused: the relays cannot follow a rotation now") {
		t.Fatalf("resuming past a refusing relay: %v", err)
	}
	if len(sf.steps) != 0 {
		t.Fatalf("a refused rotation took steps %v", sf.steps)
	}

	// Once the relay lets it, the rotation resumes where it was.
	sf.mu.Lock()
	sf.refusal = ""
	sf.mu.Unlock()
	out, _ := f.mustCtl(t, "secret", "rotate", "--poll", "5ms")
	if !strings.Contains(out, "resume    resuming the rotation from aaaa to bbbb") || !strings.Contains(out, "done      rotated") {
		t.Fatalf("resumed rotation:\n%s", out)
	}
}
