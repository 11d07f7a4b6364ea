package fleettest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/cli"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/fleetsecret"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// waitSecrets waits until every relay runs, and every relay sees every
// relay report, a secret that satisfies ok.
func waitSecrets(t *testing.T, relays []*Relay, what string, ok func(signing string, accepted []string) bool) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		for _, r := range relays {
			ring := r.Node.Secrets()
			if !ok(ring.Fingerprint(), ring.Accepted()) {
				return fmt.Errorf("relay %s does not %s: it runs %s, accepts %v", r.Node.Fleet().ID(), what, ring.Fingerprint(), ring.Accepted())
			}
			for _, rs := range r.Node.Fleet().Relays() {
				if rs.Fresh && !ok(rs.SecretFingerprint, rs.SecretAccepted) {
					return fmt.Errorf("relay %s sees %s not %s yet", r.Node.Fleet().ID(), rs.ID, what)
				}
			}
		}
		return nil
	})
}

// TestSecretRotationUnderLoad rotates the fleet secret with 'ctl secret
// rotate' while users reach a device steadily through the two relays that
// do not hold it, so that every request is a signed forward: none fails.
func TestSecretRotationUnderLoad(t *testing.T) {
	relays, _, user := fleetSetup(t, agent.ProtocolNative)
	from := relays[0].Node.Secrets().Fingerprint()
	waitSecrets(t, relays, "run the first secret", func(s string, _ []string) bool { return s == from })
	others := relays[:2]
	load := startLoad(t, 4, user, []string{"dev"}, func(i int) *Relay { return others[i%2] })
	waitRequests(t, load, 20)

	before := load.attempted.Load()
	code, out, errOut := ctl(t.Context(), relays[2], "secret", "rotate", "--grace", "0", "--poll", "20ms", "-o", "json")
	during := load.attempted.Load() - before
	waitRequests(t, load, load.attempted.Load()+20)
	load.check(t)
	if code != 0 {
		t.Fatalf("rotate: exit %d\n%s\n%s", code, out, errOut)
	}
	if during < 10 {
		t.Errorf("only %d requests while the rotation ran", during)
	}
	steps := rotationSteps(t, out)
	to := steps[len(steps)-1].To
	if to == "" || to == from || !slices.Equal(mainPhases(steps), []string{"begin", "sign", "done"}) {
		t.Fatalf("rotation steps %v, from %s to %s", mainPhases(steps), from, to)
	}
	waitSecrets(t, relays, "run only the new secret", func(s string, acc []string) bool { return s == to && slices.Equal(acc, []string{to}) })
}

// waitRequests waits until the load has attempted n requests.
func waitRequests(t *testing.T, l *steadyLoad, n int64) {
	t.Helper()
	Eventually(t, 20*time.Second, func() error {
		if got := l.attempted.Load(); got < n {
			return fmt.Errorf("%d of %d requests", got, n)
		}
		return nil
	})
}

// rotationStep is a line of 'ctl secret rotate -o json'.
type rotationStep struct {
	Phase, From, To, Message string
}

func rotationSteps(t *testing.T, out string) []rotationStep {
	t.Helper()
	var steps []rotationStep
	for line := range strings.Lines(out) {
		var s rotationStep
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("a progress line that is not JSON: %q", line)
		}
		steps = append(steps, s)
	}
	if len(steps) == 0 {
		t.Fatal("no progress printed")
	}
	return steps
}

// mainPhases returns the phases of steps that change the record, in order:
// what is left without the progress of the waits.
func mainPhases(steps []rotationStep) []string {
	var out []string
	for _, s := range steps {
		if s.Phase != "waiting" {
			out = append(out, s.Phase)
		}
	}
	return out
}

// cancelOn is a writer that cancels a context when a line with a given
// phase is written to it.
type cancelOn struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	phase  string
	cancel context.CancelFunc
}

func (w *cancelOn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if bytes.Contains(p, []byte(`"phase":"`+w.phase+`"`)) {
		w.cancel()
	}
	return w.buf.Write(p)
}

// TestSecretRotationResumes interrupts 'ctl secret rotate' right after it
// added the new secret: the rotation stays recorded, 'ctl secret status'
// shows it, and running rotate again finishes it with the same secret.
func TestSecretRotationResumes(t *testing.T) {
	relays := StartFleet(t, 3)
	from := relays[0].Node.Secrets().Fingerprint()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &cancelOn{phase: "begin", cancel: cancel}
	var errOut bytes.Buffer
	args := []string{"ctl", "--admin", relays[0].AdminURL, "--token-file", relays[0].Node.AdminTokenPath(), "-o", "json", "secret", "rotate", "--poll", "20ms"}
	if code := cli.Run(ctx, args, w, &errOut); code != cli.ExitFailure || !strings.Contains(errOut.String(), "run 'switchboard ctl secret rotate' again to resume") {
		t.Fatalf("interrupted rotate: exit %d, %q", code, errOut.String())
	}
	to := rotationSteps(t, w.buf.String())[0].To

	// The other relays see the record as their watches deliver it (the
	// third resumes the rotation below, from what its mirror holds).
	var st control.SecretStatus
	for _, r := range relays[1:] {
		Eventually(t, 5*time.Second, func() error {
			code, out, stderr := ctl(t.Context(), r, "secret", "status", "-o", "json")
			st = control.SecretStatus{}
			if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
				t.Fatalf("status: exit %d, %v, %s", code, err, stderr)
			}
			if st.Record == nil || st.Record.Rotation == nil || st.Record.Rotation.To != to || st.Record.Rotation.From != from {
				return fmt.Errorf("the interrupted rotation is not recorded: %+v", st.Record)
			}
			return nil
		})
	}
	if len(st.Relays) != 3 || len(st.Parity.Odd) != 0 {
		t.Fatalf("status relays %+v, parity %+v", st.Relays, st.Parity)
	}

	// Another machine, another relay: the same rotation goes on.
	code, out, stderr := ctl(t.Context(), relays[2], "secret", "rotate", "--poll", "20ms", "--grace", "1h")
	if code != 0 || !strings.Contains(out, "resuming the rotation from "+from+" to "+to) || !strings.Contains(out, "stays accepted for 1h0m0s") {
		t.Fatalf("resumed rotate: exit %d\n%s\n%s", code, out, stderr)
	}
	waitSecrets(t, relays, "sign with the new secret and keep the old one for its grace", func(s string, acc []string) bool {
		return s == to && slices.Equal(acc, []string{to, from})
	})
	Eventually(t, 5*time.Second, func() error {
		code, out, _ := ctl(t.Context(), relays[0], "secret", "status")
		if code != 0 || !strings.Contains(out, "signs with "+to) || !strings.Contains(out, "none in progress") || !strings.Contains(out, from+" (until ") {
			return fmt.Errorf("status after the rotation:\n%s", out)
		}
		return nil
	})
}

// secretFile writes secrets, one per line in base64, to a new file.
func secretFile(t *testing.T, secrets ...[]byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet.secret")
	writeSecretFile(t, path, secrets...)
	return path
}

func writeSecretFile(t *testing.T, path string, secrets ...[]byte) {
	t.Helper()
	var lines []string
	for _, s := range secrets {
		lines = append(lines, base64.StdEncoding.EncodeToString(s))
	}
	// Written beside and renamed, as a Kubernetes Secret volume swaps it.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// storedSecret reads the fleet's stored secret record from NATS.
func storedSecret(t *testing.T, natsURL string) fleetsecret.Record {
	t.Helper()
	st, err := store.Open(t.Context(), store.Config{URLs: []string{natsURL}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	kv, err := st.KeyValue(t.Context(), fleet.BucketFleet)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(t.Context(), fleetsecret.RecordKey)
	if err != nil {
		t.Fatal(err)
	}
	var rec fleetsecret.Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// metricLine returns the line of metric{relay="id"} on relay r's /metrics.
func metricLine(t *testing.T, r *Relay, metric, id string) string {
	t.Helper()
	resp, err := http.Get(r.AdminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	prefix := fmt.Sprintf(`%s{relay=%q} `, metric, id)
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, prefix) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// TestSecretMismatch starts a relay with a --fleet-secret-file that is not
// the fleet's secret: every relay reports it odd by event and metric within
// a few heartbeats, ctl shows it, no rotation starts, nothing is placed on
// it, and neither side forwards to the other (users get a 503 through it,
// never another relay's 401). Fixing its file heals parity, and requests
// through it work again.
func TestSecretMismatch(t *testing.T) {
	relays := StartFleet(t, 2)
	natsURL := relays[0].Node.Config().NATS[0]
	path := secretFile(t, secret.New())
	odd := StartRelay(t, FastFleet, func(c *node.Config) {
		c.NATS = []string{natsURL}
		c.FleetSecret.File = path
		c.Broker.NoAgentGrace = 300 * time.Millisecond
	})
	all := append(slices.Clone(relays), odd)
	oddID := odd.Node.Fleet().ID()
	good := relays[0].Node.Secrets().Fingerprint()

	began := time.Now()
	Eventually(t, 10*time.Second, func() error {
		evs, err := relays[1].Node.Fleet().Events(t.Context(), fleet.MaxEventsList)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Type == fleet.EventSecretMismatch && e.RelayID == oddID && strings.Contains(e.Message, good) {
				return nil
			}
		}
		return errors.New("no secret.mismatch event for the odd relay")
	})
	t.Logf("odd relay reported after %s", time.Since(began).Round(time.Millisecond))
	Eventually(t, 5*time.Second, func() error {
		for _, r := range all {
			if line := metricLine(t, r, "switchboard_fleet_secret_mismatch", oddID); !strings.HasSuffix(line, " 1") {
				return fmt.Errorf("relay %s: %q", r.Node.Fleet().ID(), line)
			}
			if line := metricLine(t, r, "switchboard_fleet_secret_mismatch", relays[0].Node.Fleet().ID()); !strings.HasSuffix(line, " 0") {
				return fmt.Errorf("relay %s: %q", r.Node.Fleet().ID(), line)
			}
		}
		return nil
	})

	// ctl: the warning, the fingerprint per relay, and no rotation.
	code, out, _ := ctl(t.Context(), relays[0], "status")
	if code != 0 || !strings.Contains(out, "WARNING: relay(s) "+oddID+" run another fleet secret") {
		t.Errorf("ctl status:\n%s", out)
	}
	code, out, _ = ctl(t.Context(), relays[0], "relays", "list", "-o", "json")
	var list []control.Relay
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list) != 3 {
		t.Fatalf("relays list: %v\n%s", err, out)
	}
	for _, rs := range list {
		want := good
		if rs.ID == oddID {
			want = odd.Node.Secrets().Fingerprint()
		}
		if rs.SecretFingerprint != want {
			t.Errorf("relays list: %s has secret_fingerprint %q, want %q", rs.ID, rs.SecretFingerprint, want)
		}
	}
	code, _, stderr := ctl(t.Context(), relays[0], "secret", "rotate")
	if code != cli.ExitFailure || !strings.Contains(stderr, oddID+" run a fleet secret from --fleet-secret-file") {
		t.Errorf("rotate with a file-supplied relay: exit %d, %q", code, stderr)
	}

	// An agent arriving at the odd relay is sent to a relay in parity.
	Eventually(t, 5*time.Second, func() error {
		if !odd.Node.FleetSecret().Odd(oddID) {
			return errors.New("the odd relay does not know it yet")
		}
		return nil
	})
	b := newBackend(t, "b1")
	StartAgent(t, odd, "dev", b.URL, FleetToken(t, all, auth.KindAgent, "agent", "dev"))
	user := FleetToken(t, all, auth.KindUser, "alice", "dev")
	var holder *Relay
	Eventually(t, 10*time.Second, func() error {
		d, err := relays[0].Node.Fleet().Device("dev")
		if err != nil {
			return err
		}
		if d.RelayID == oddID || d.Agents == 0 {
			return fmt.Errorf("dev is on %s", d.RelayID)
		}
		for _, r := range relays {
			if r.Node.Fleet().ID() == d.RelayID {
				holder = r
			}
		}
		return nil
	})
	for _, r := range relays {
		if code := secretGet(t, r, user); code != http.StatusOK {
			t.Errorf("through relay %s in parity: %d", r.Node.Fleet().ID(), code)
		}
	}
	// Through the odd relay: the forward is held back (the holder said it
	// refuses this secret) and the request fails as a device out of reach.
	if code := secretGet(t, odd, user); code != http.StatusServiceUnavailable {
		t.Errorf("through the odd relay: %d, want 503", code)
	}
	// Had it forwarded, the holder would have refused it, saying why.
	s, err := peer.NewSigner(odd.Node.Secrets(), oddID)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, holder.URL+"/client/dev/echo/x", nil)
	s.Sign(req.Header, "dev")
	resp, err := NewClient(t, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "does not accept") {
		t.Errorf("a forward signed with the odd secret: %s %s", resp.Status, body)
	}

	// Fix the file: the fleet's secret. Parity heals and the odd relay
	// forwards again.
	rec := storedSecret(t, natsURL)
	var fleetSecret []byte
	for _, s := range rec.Secrets {
		if s.Fingerprint == rec.Signing {
			fleetSecret = s.Secret
		}
	}
	writeSecretFile(t, path, fleetSecret)
	Eventually(t, 10*time.Second, func() error {
		evs, err := relays[1].Node.Fleet().Events(t.Context(), fleet.MaxEventsList)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Type == fleet.EventSecretParity && e.RelayID == oddID {
				return nil
			}
		}
		return errors.New("no secret.parity event")
	})
	Eventually(t, 10*time.Second, func() error {
		for _, r := range all {
			if line := metricLine(t, r, "switchboard_fleet_secret_mismatch", oddID); !strings.HasSuffix(line, " 0") {
				return fmt.Errorf("relay %s: %q", r.Node.Fleet().ID(), line)
			}
		}
		if code := secretGet(t, odd, user); code != http.StatusOK {
			return fmt.Errorf("through the healed relay: %d", code)
		}
		return nil
	})
}

// secretGet GETs the device "dev" through relay r as user and returns the
// status.
func secretGet(t *testing.T, r *Relay, user string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.URL+"/client/dev/echo/x", nil)
	req.Header.Set("Authorization", "Bearer "+user)
	resp, err := NewClient(t, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestV1ForwardRefused: a forward signed in the raw-secret v1 form of
// builds that never shipped is refused, even with the fleet's own secret;
// forwards between the relays, signed v2, are taken.
func TestV1ForwardRefused(t *testing.T) {
	st, err := store.Open(t.Context(), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	join := func(c *node.Config) { c.NATS = []string{st.ClientURL()} }
	relays := []*Relay{StartRelay(t, FastFleet, join), StartRelay(t, FastFleet, join)}
	rec := storedSecret(t, st.ClientURL())
	var raw []byte
	for _, s := range rec.Secrets {
		if s.Fingerprint == rec.Signing {
			raw = s.Secret
		}
	}

	holder, others := HolderFor(t, relays, "dev")
	b := newBackend(t, "b1")
	StartAgent(t, holder, "dev", b.URL, FleetToken(t, relays, auth.KindAgent, "agent", "dev"))
	waitHolder(t, relays, "dev", holder)
	user := FleetToken(t, relays, auth.KindUser, "alice", "dev")
	if code := secretGet(t, others[0], user); code != http.StatusOK {
		t.Fatalf("a forward between the relays: %d", code)
	}
	ts := time.Now().Unix()
	m := hmac.New(sha256.New, raw)
	fmt.Fprintf(m, "v1\n%s\n%d\n%s", "rl-0dd0dd00", ts, "dev")
	req, _ := http.NewRequest(http.MethodGet, holder.URL+"/client/dev/echo/old", nil)
	req.Header.Set(peer.Header, fmt.Sprintf("v1 rl-0dd0dd00 %d %s", ts, hex.EncodeToString(m.Sum(nil))))
	resp, err := NewClient(t, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a v1 forward: %s, want 401", resp.Status)
	}
}
