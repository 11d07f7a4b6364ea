package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleetsecret"
)

// Defaults of 'ctl secret rotate'.
const (
	defaultRotationGrace   = 8 * time.Hour // the default lifetime of the browser sessions access codes open
	defaultRotationTimeout = 2 * time.Minute
)

// runSecret runs 'ctl secret': status or rotate.
func runSecret(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return runSubcommand(ctx, g, "ctl secret", args, stdout, stderr, []subcommand{
		{"status", secretStatus},
		{"rotate", secretRotate},
	})
}

func secretStatus(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return showCommand(ctx, g, "ctl secret status", args, stdout, stderr, (*control.Client).SecretStatus, writeSecretStatus)
}

func writeSecretStatus(w io.Writer, st control.SecretStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	switch rec := st.Record; {
	case rec == nil:
		fmt.Fprintf(tw, "stored secret\tnone (the relays run from --fleet-secret-file)\n")
	default:
		fmt.Fprintf(tw, "stored secret\tsigns with %s (generation %d, changed %s by %s)\n", rec.Signing, rec.Generation, age(rec.UpdatedAt, now), orDash(rec.UpdatedBy))
		var acc []string
		for _, s := range rec.Secrets {
			a := s.Fingerprint
			if !s.RetireAt.IsZero() {
				a += " (until " + s.RetireAt.UTC().Format(time.RFC3339) + ")"
			}
			acc = append(acc, a)
		}
		fmt.Fprintf(tw, "accepted\t%s\n", strings.Join(acc, ", "))
		if rot := rec.Rotation; rot != nil {
			fmt.Fprintf(tw, "rotation\tfrom %s to %s, phase %s, begun %s by %s\n", rot.From, rot.To, rot.Phase, age(rot.StartedAt, now), orDash(rot.By))
		} else {
			fmt.Fprintf(tw, "rotation\tnone in progress\n")
		}
	}
	p := st.Parity
	switch {
	case p.Expected == "":
		fmt.Fprintf(tw, "parity\tno fresh relay reports a secret\n")
	case len(p.Odd) == 0:
		fmt.Fprintf(tw, "parity\tok: every fresh relay runs %s (%s)\n", p.Expected, p.Basis)
	default:
		fmt.Fprintf(tw, "parity\tBROKEN: %s run another secret than %s (%s); see docs/fleet-secret.md\n", strings.Join(p.Odd, ", "), p.Expected, p.Basis)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "RELAY\tFRESH\tSOURCE\tSIGNS\tACCEPTS\tODD")
	for _, r := range st.Relays {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, yesNo(r.Fresh), orDash(r.SecretSource), orDash(r.SecretFingerprint),
			orDash(strings.Join(r.SecretAccepted, ",")), yesNo(r.Odd))
	}
	return tw.Flush()
}

// rotateOptions are the flags of 'ctl secret rotate'.
type rotateOptions struct {
	grace   time.Duration
	timeout time.Duration
	poll    time.Duration
}

func secretRotate(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	var o rotateOptions
	fs := newFlagSet("ctl secret rotate", stderr)
	g.register(fs)
	fs.DurationVar(&o.grace, "grace", defaultRotationGrace, "keep the old secret accepted (never signing) this `long` after the rotation, so that access codes and browser sessions signed with it stay valid; 0 drops it at once (after a leak)")
	fs.DurationVar(&o.timeout, "timeout", defaultRotationTimeout, "how `long` to wait for every relay at each step before giving up; the rotation stays recorded and resumes when run again")
	fs.DurationVar(&o.poll, "poll", time.Second, "how often to look at the relays while waiting (`interval`)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.grace < 0 || o.grace > control.MaxRotationGrace {
		return usageErrorf("ctl secret rotate: --grace %s: give 0 to %s", o.grace, control.MaxRotationGrace)
	}
	if o.timeout <= 0 || o.poll <= 0 {
		return usageErrorf("ctl secret rotate: --timeout and --poll must be positive")
	}
	c, err := g.connect()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := &rotator{c: c, g: g, o: o, out: &stepWriter{w: stdout, asJSON: g.output == outputJSON}, by: whoAmI()}
	if err := r.run(ctx); err != nil {
		return fmt.Errorf("ctl secret rotate: %w", err)
	}
	return nil
}

// errRotationRefused marks a rotation refused before it changed anything.
var errRotationRefused = errors.New("rotation refused")

// rotator drives one rotation of the fleet secret through the operator
// API: accept the new secret everywhere, then sign with it everywhere,
// then drop the old one. Each step waits for every fresh relay to report
// the previous one on its heartbeat, so that no relay ever signs with a
// secret another does not accept.
type rotator struct {
	c   *control.Client
	g   *ctlGlobals
	o   rotateOptions
	out *stepWriter
	by  string
}

// run takes the rotation's steps. Whether a step may be taken is the
// relay's decision alone (its guards answer 409 with why): the begin step,
// which also finds a rotation in progress, is asked every time, so that a
// resumed rotation passes the same guards as a new one.
func (r *rotator) run(ctx context.Context) error {
	st, err := r.c.SecretStatus(ctx)
	if err != nil {
		return r.g.explain(err)
	}
	info, err := r.c.BeginRotation(ctx, r.by)
	if err != nil {
		return r.explain(err)
	}
	rot := info.Rotation
	if rot == nil {
		return fmt.Errorf("%w: the relay began no rotation", errRotationRefused)
	}
	if prev := st.Record; prev != nil && prev.Rotation != nil && prev.Rotation.To == rot.To {
		r.out.say("resume", rot, fmt.Sprintf("resuming the rotation from %s to %s begun %s by %s, at phase %s", rot.From, rot.To, rot.StartedAt.Format(time.RFC3339), orDash(rot.By), rot.Phase))
	} else {
		r.out.say("begin", rot, fmt.Sprintf("added the new secret %s, accepted only; relays still sign with %s", rot.To, rot.From))
	}
	if rot.Phase == control.RotationAccept {
		if err := r.wait(ctx, rot, "accept", func(rs control.RelaySecret) bool { return slices.Contains(rs.SecretAccepted, rot.To) }); err != nil {
			return err
		}
		if _, err := r.c.SignWithNewSecret(ctx, r.by); err != nil {
			return r.explain(err)
		}
		rot.Phase = control.RotationSign
		r.out.say("sign", rot, fmt.Sprintf("relays now sign with %s; %s is still accepted", rot.To, rot.From))
	}
	if err := r.wait(ctx, rot, "sign with", func(rs control.RelaySecret) bool { return rs.SecretFingerprint == rot.To }); err != nil {
		return err
	}
	if _, err := r.c.FinishRotation(ctx, r.by, r.o.grace); err != nil {
		return r.explain(err)
	}
	msg := fmt.Sprintf("rotated: relays sign with %s; %s is dropped", rot.To, rot.From)
	if r.o.grace > 0 {
		msg = fmt.Sprintf("rotated: relays sign with %s; %s stays accepted for %s, then housekeeping drops it", rot.To, rot.From, r.o.grace)
	}
	r.out.say("done", rot, msg)
	return nil
}

// explain says what to do about a failed step: a 409 is a refusal with
// its reason.
func (r *rotator) explain(err error) error {
	var apiErr *control.APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict {
		return fmt.Errorf("%w: %s", errRotationRefused, strings.TrimPrefix(apiErr.Message, fleetsecret.ErrRotationRefused.Error()+": "))
	}
	return r.g.explain(err)
}

// wait polls until every fresh relay satisfies done, saying how many do
// whenever that changes, for at most --timeout.
func (r *rotator) wait(ctx context.Context, rot *control.Rotation, what string, done func(control.RelaySecret) bool) error {
	deadline := time.Now().Add(r.o.timeout)
	lastDone := -1
	for {
		st, err := r.c.SecretStatus(ctx)
		switch {
		case errors.Is(err, control.ErrUnreachable) && time.Now().Before(deadline):
		case err != nil:
			return r.g.explain(err)
		default:
			var late []string
			fresh := 0
			for _, rs := range st.Relays {
				if !rs.Fresh {
					continue
				}
				fresh++
				if !done(rs) {
					late = append(late, rs.ID)
				}
			}
			if n := fresh - len(late); n != lastDone {
				r.out.say("waiting", rot, fmt.Sprintf("%d of %d fresh relays %s %s", n, fresh, what, rot.To))
				lastDone = n
			}
			if len(late) == 0 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("relay(s) %s did not %s %s within %s; the rotation stays recorded at phase %s: see 'switchboard ctl secret status', fix them, and run 'switchboard ctl secret rotate' again to resume",
					strings.Join(late, ", "), what, rot.To, r.o.timeout, rot.Phase)
			}
		}
		if err := pause(ctx, r.o.poll); err != nil {
			return fmt.Errorf("%w; the rotation stays recorded at phase %s: run 'switchboard ctl secret rotate' again to resume", err, rot.Phase)
		}
	}
}

// stepWriter prints a rotation's progress: a line per step, or a JSON
// object per line with -o json.
type stepWriter struct {
	w      io.Writer
	asJSON bool
}

// rotationStep is one line of -o json progress.
type rotationStep struct {
	Time    time.Time `json:"time"`
	Phase   string    `json:"phase"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Message string    `json:"message"`
}

func (sw *stepWriter) say(phase string, rot *control.Rotation, msg string) {
	step := rotationStep{Time: time.Now().UTC(), Phase: phase, From: rot.From, To: rot.To, Message: msg}
	if sw.asJSON {
		b, _ := json.Marshal(step)
		fmt.Fprintf(sw.w, "%s\n", b)
		return
	}
	fmt.Fprintf(sw.w, "%s  %-8s  %s\n", step.Time.Format("15:04:05"), phase, msg)
}
