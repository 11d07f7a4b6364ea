package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/ranking"
)

// rollOptions are the flags of 'ctl roll'.
type rollOptions struct {
	updateCmd     string
	emptyTimeout  time.Duration
	upTimeout     time.Duration
	expectVersion string
	poll          time.Duration
}

// runRoll runs 'ctl roll': enable, disable, status, or a rolling update.
func runRoll(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "enable", "disable":
			return rollSwitch(ctx, g, args[0] == "enable", args[1:], stdout, stderr)
		case "status":
			return rollStatus(ctx, g, args[1:], stdout, stderr)
		}
	}
	var o rollOptions
	fs := newFlagSet("ctl roll", stderr)
	g.register(fs)
	fs.StringVar(&o.updateCmd, "update-cmd", "", "the `command` that updates one relay, run by sh; {id}, {address} and {hostname} are replaced by the relay's")
	fs.DurationVar(&o.emptyTimeout, "empty-timeout", 5*time.Minute, "how `long` to wait for a held relay to empty before updating it anyway")
	fs.DurationVar(&o.upTimeout, "up-timeout", 5*time.Minute, "how `long` to wait for an updated relay to come back fresh and healthy")
	fs.StringVar(&o.expectVersion, "expect-version", "", "the `version` each relay must report after its update (default: any, once it restarted)")
	fs.DurationVar(&o.poll, "poll", time.Second, "how often to look at the fleet while waiting (`interval`)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.updateCmd == "" {
		return usageErrorf("ctl roll: give --update-cmd, the command that updates one relay (see docs/operations.md)")
	}
	c, err := g.connect()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := &roller{c: c, g: g, o: o, out: newRollWriter(stdout, g.output == outputJSON), stderr: stderr}
	return r.run(ctx)
}

func rollSwitch(ctx context.Context, g *ctlGlobals, on bool, args []string, stdout, stderr io.Writer) error {
	c, err := g.connectFor("ctl roll", args, stderr)
	if err != nil {
		return err
	}
	if err := c.SetRollEnabled(ctx, on); err != nil {
		return fmt.Errorf("ctl roll: %w", g.explain(err))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, control.RollSwitch{Enabled: on})
	}
	if on {
		fmt.Fprintln(stdout, "rolling updates are enabled for this fleet")
	} else {
		fmt.Fprintln(stdout, "rolling updates are disabled for this fleet")
	}
	return nil
}

func rollStatus(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	c, err := g.connectFor("ctl roll status", args, stderr)
	if err != nil {
		return err
	}
	info, err := c.RollInfo(ctx)
	if err != nil {
		return fmt.Errorf("ctl roll status: %w", g.explain(err))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, info)
	}
	fmt.Fprintf(stdout, "enabled  %s\n", yesNo(info.Enabled))
	if info.State == nil {
		fmt.Fprintln(stdout, "roll     none in progress")
		return nil
	}
	s := info.State
	fmt.Fprintf(stdout, "roll     started %s by %s; %d of %d relays done\n", s.StartedAt.Format(time.RFC3339), orDash(s.By), len(s.Done), len(s.Order))
	if s.Current != "" {
		fmt.Fprintf(stdout, "current  %s (%s)\n", s.Current, s.Phase)
	}
	return nil
}

// errRollRefused marks a roll that a guard refused before touching anything.
var errRollRefused = errors.New("roll refused")

// roller drives one rolling update through the operator API.
type roller struct {
	c      *control.Client
	g      *ctlGlobals
	o      rollOptions
	out    *rollWriter
	stderr io.Writer
	state  control.RollState
}

func (r *roller) run(ctx context.Context) error {
	info, err := r.c.RollInfo(ctx)
	if err != nil {
		return fmt.Errorf("ctl roll: %w", r.g.explain(err))
	}
	if !info.Enabled {
		return fmt.Errorf("ctl roll: %w: rolling updates are off for this fleet; the fleet's owner turns them on with 'switchboard ctl roll enable'", errRollRefused)
	}
	relays, err := r.c.ListRelays(ctx)
	if err != nil {
		return fmt.Errorf("ctl roll: %w", r.g.explain(err))
	}
	if info.State != nil {
		r.state = *info.State
		r.out.say("", "resume", fmt.Sprintf("resuming the roll started %s: %d of %d relays done", info.State.StartedAt.Format(time.RFC3339), len(r.state.Done), len(r.state.Order)))
	} else {
		r.state = control.RollState{StartedAt: time.Now().UTC(), By: whoAmI()}
		for _, rs := range relays {
			if rs.Fresh {
				r.state.Order = append(r.state.Order, rs.ID)
			}
		}
		slices.Sort(r.state.Order)
		if len(r.state.Order) == 0 {
			return fmt.Errorf("ctl roll: %w: no relay is beating", errRollRefused)
		}
		// Refuse before anything is held or recorded.
		if err := r.checkGuards(ctx, r.state.Order[0]); err != nil {
			return fmt.Errorf("ctl roll: %w", err)
		}
		if err := r.save(ctx); err != nil {
			return err
		}
		r.out.say("", "start", fmt.Sprintf("rolling %d relays, one at a time: %s", len(r.state.Order), strings.Join(r.state.Order, ", ")))
	}
	start := time.Now()
	for _, id := range r.state.Order {
		if slices.Contains(r.state.Done, id) {
			continue
		}
		if err := r.rollOne(ctx, id); err != nil {
			return fmt.Errorf("ctl roll: relay %s: %w", id, err)
		}
	}
	if err := r.c.ClearRoll(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("ctl roll: %w", r.g.explain(err))
	}
	r.out.say("", "done", fmt.Sprintf("rolled %d relays in %s", len(r.state.Order), time.Since(start).Round(time.Second)))
	return nil
}

// checkGuards asks the drain guards of the relay answering whether relay id
// may be held out of routing now, without holding it: it may not when it is
// the last relay serving or when the other relays cannot take its devices.
// The guards are the server's, the same for every way of draining; the
// roll has none of its own.
func (r *roller) checkGuards(ctx context.Context, id string) error {
	_, err := r.c.CheckDrain(ctx, id)
	return r.refused(id, err)
}

// refused marks a drain the guards refused as errRollRefused.
func (r *roller) refused(id string, err error) error {
	var apiErr *control.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict:
		return fmt.Errorf("%w: %s", errRollRefused, apiErr.Message)
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound:
		return fmt.Errorf("%w: relay %s is not in the fleet any more", errRollRefused, id)
	case err != nil:
		return r.g.explain(err)
	}
	return nil
}

// rollOne holds relay id out of routing, waits for it to empty, updates it,
// waits for it to come back, and releases the hold — the release always
// happens, also on error or interrupt.
func (r *roller) rollOne(ctx context.Context, id string) (err error) {
	resumeAt := ""
	if r.state.Current == id {
		resumeAt = r.state.Phase
	}
	relays, err := r.c.ListRelays(ctx)
	if err != nil {
		return r.g.explain(err)
	}
	before := findRelay(relays, id)
	if before == nil {
		return fmt.Errorf("%w: it is not in the fleet any more", errRollRefused)
	}
	if resumeAt == "" || resumeAt == control.RollHold {
		if err := r.checkGuards(ctx, id); err != nil {
			return err
		}
	}
	// The relay answering guards the drain itself too; refused, nothing is
	// held. A roll resumed past the hold finds the relay drained already,
	// which passes.
	if _, err := r.c.SetRelayDraining(ctx, id, true); err != nil {
		return r.refused(id, err)
	}
	r.out.say(id, control.RollHold, "held out of routing: its devices move to the other relays")
	defer func() {
		// Release the hold whatever happened: a relay left held carries no traffic.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, rerr := r.c.SetRelayDraining(rctx, id, false); rerr != nil {
			err = errors.Join(err, fmt.Errorf("releasing the hold failed; run 'switchboard ctl relays undrain %s': %w", id, rerr))
			return
		}
		r.out.say(id, "released", "back in routing")
	}()
	r.state.Current = id
	if resumeAt != control.RollReturning {
		r.state.Phase = control.RollHold
		if err := r.save(ctx); err != nil {
			return err
		}
		if err := r.waitEmpty(ctx, id); err != nil {
			return err
		}
		r.state.Phase, r.state.PrevStartedAt = control.RollUpdating, before.StartedAt
		if err := r.save(ctx); err != nil {
			return err
		}
		if err := r.update(ctx, *before); err != nil {
			return err
		}
		r.state.Phase = control.RollReturning
		if err := r.save(ctx); err != nil {
			return err
		}
	}
	if err := r.waitBack(ctx, id, r.state.PrevStartedAt); err != nil {
		return err
	}
	r.state.Done = append(r.state.Done, id)
	r.state.Current, r.state.Phase, r.state.PrevStartedAt = "", "", time.Time{}
	return r.save(ctx)
}

func findRelay(relays []control.Relay, id string) *control.Relay {
	for i := range relays {
		if relays[i].ID == id {
			return &relays[i]
		}
	}
	return nil
}

// waitEmpty waits until relay id holds no device and no agent, or until
// --empty-timeout, after which the update goes ahead and the relay's own
// shutdown drain ends what is left.
func (r *roller) waitEmpty(ctx context.Context, id string) error {
	deadline := time.Now().Add(r.o.emptyTimeout)
	last := -1
	for {
		relays, err := r.c.ListRelays(ctx)
		if errors.Is(err, control.ErrUnreachable) && time.Now().Before(deadline) {
			if err := pause(ctx, r.o.poll); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return r.g.explain(err)
		}
		rs := findRelay(relays, id)
		if rs == nil {
			return errors.New("it left the fleet while being emptied")
		}
		left := rs.AttachedDevices + rs.AgentSessions
		if left == 0 {
			r.out.say(id, "empty", "no device or agent left")
			return nil
		}
		if left != last {
			r.out.say(id, "emptying", fmt.Sprintf("%d devices and %d agent connections left", rs.AttachedDevices, rs.AgentSessions))
			last = left
		}
		if time.Now().After(deadline) {
			r.out.say(id, "emptying", fmt.Sprintf("still not empty after %s; updating anyway", r.o.emptyTimeout))
			return nil
		}
		if err := pause(ctx, r.o.poll); err != nil {
			return err
		}
	}
}

// update runs the operator's update step for one relay.
func (r *roller) update(ctx context.Context, rs control.Relay) error {
	address := ""
	if len(rs.Addresses) > 0 {
		address = rs.Addresses[0]
	}
	cmdline := strings.NewReplacer("{id}", shellQuote(rs.ID), "{address}", shellQuote(address), "{hostname}", shellQuote(rs.Hostname)).Replace(r.o.updateCmd)
	r.out.say(rs.ID, control.RollUpdating, "running: "+cmdline)
	cmd := exec.CommandContext(ctx, "sh", "-c", cmdline)
	// On Ctrl-C the whole step stops, not only its shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdout, cmd.Stderr = r.stderr, r.stderr
	cmd.Env = append(os.Environ(), "SWITCHBOARD_RELAY_ID="+rs.ID, "SWITCHBOARD_RELAY_ADDRESS="+address)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the update command failed: %w", err)
	}
	return nil
}

// waitBack waits until relay id runs again — a process other than the one
// that started at prev — fresh and healthy, with the expected version if one
// was given. Comparing start times of the relay's own clock keeps the check
// free of clock skew between this machine and the relay.
func (r *roller) waitBack(ctx context.Context, id string, prev time.Time) error {
	deadline := time.Now().Add(r.o.upTimeout)
	for {
		relays, err := r.c.ListRelays(ctx)
		if errors.Is(err, control.ErrUnreachable) && time.Now().Before(deadline) {
			// The relay answering the API may be the one being updated.
			if err := pause(ctx, r.o.poll); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return r.g.explain(err)
		}
		// Up, not available: the roll still holds it.
		if rs := findRelay(relays, id); rs != nil && (ranking.State{Fresh: rs.Fresh, Healthy: rs.Healthy, Stopping: rs.Stopping}).Up() && !rs.StartedAt.Equal(prev) &&
			(r.o.expectVersion == "" || rs.Version == r.o.expectVersion) {
			r.out.say(id, "back", fmt.Sprintf("running version %s, fresh and healthy", rs.Version))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("it did not come back fresh and healthy%s within %s", versionClause(r.o.expectVersion), r.o.upTimeout)
		}
		if err := pause(ctx, r.o.poll); err != nil {
			return err
		}
	}
}

func versionClause(v string) string {
	if v == "" {
		return ""
	}
	return " with version " + v
}

// save records the roll's state. The relay answering the API may be the one
// being updated: an unreachable API is retried until --up-timeout.
func (r *roller) save(ctx context.Context) error {
	deadline := time.Now().Add(r.o.upTimeout)
	for {
		err := r.c.SaveRoll(context.WithoutCancel(ctx), r.state)
		if err == nil {
			return nil
		}
		if !errors.Is(err, control.ErrUnreachable) || time.Now().After(deadline) {
			return fmt.Errorf("recording the roll: %w", r.g.explain(err))
		}
		if err := pause(context.WithoutCancel(ctx), r.o.poll); err != nil {
			return err
		}
	}
}

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("interrupted: %w", ctx.Err())
	case <-t.C:
		return nil
	}
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func whoAmI() string {
	host, _ := os.Hostname()
	return os.Getenv("USER") + "@" + host
}

// rollWriter prints the roll's progress: a line per step, or a JSON object
// per line with -o json.
type rollWriter struct {
	w      io.Writer
	asJSON bool
}

func newRollWriter(w io.Writer, asJSON bool) *rollWriter { return &rollWriter{w: w, asJSON: asJSON} }

// rollStep is one line of -o json progress.
type rollStep struct {
	Time    time.Time `json:"time"`
	Relay   string    `json:"relay,omitempty"`
	Phase   string    `json:"phase"`
	Message string    `json:"message"`
}

func (rw *rollWriter) say(relay, phase, msg string) {
	step := rollStep{Time: time.Now().UTC(), Relay: relay, Phase: phase, Message: msg}
	if rw.asJSON {
		b, _ := json.Marshal(step)
		fmt.Fprintf(rw.w, "%s\n", b)
		return
	}
	who := relay
	if who == "" {
		who = "roll"
	}
	fmt.Fprintf(rw.w, "%s  %-11s  %-9s  %s\n", step.Time.Format("15:04:05"), who, phase, msg)
}
