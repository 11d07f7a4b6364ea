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
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleet"
)

// Commands that list what exists, named by errors about things that do not.
const (
	listRelaysCmd  = "switchboard ctl relays list"
	listDevicesCmd = "switchboard ctl devices list"
)

// connect checks the global flags and returns an operator API client.
func (g *ctlGlobals) connect() (*control.Client, error) {
	if err := g.validate(); err != nil {
		return nil, err
	}
	return g.client()
}

// notFoundError is a 404 answer of the operator API, said in terms of the
// command that lists what does exist.
type notFoundError struct {
	what string // what was asked for, e.g. `relay rl-1234abcd`
	list string // the command that lists the existing ones
	err  error  // the *control.APIError
}

func (e *notFoundError) Error() string {
	return fmt.Sprintf("%s is not in the fleet; see '%s'", e.what, e.list)
}

func (e *notFoundError) Unwrap() error { return e.err }

// explainNotFound turns a 404 answer about what into a notFoundError and
// explains any other failure as g.explain does.
func (g *ctlGlobals) explainNotFound(err error, what, list string) error {
	var apiErr *control.APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
		return &notFoundError{what: what, list: list, err: err}
	}
	return g.explain(err)
}

// --- relays ---

func runRelays(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	drain := func(draining bool) func(context.Context, *ctlGlobals, []string, io.Writer, io.Writer) error {
		return func(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
			return relaysDrain(ctx, g, args, draining, stdout, stderr)
		}
	}
	return runSubcommand(ctx, g, "ctl relays", args, stdout, stderr, []subcommand{
		{"list", relaysList},
		{"drain", drain(true)},
		{"undrain", drain(false)},
	})
}

func relaysList(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return listCommand(ctx, g, "ctl relays list", args, stdout, stderr, (*control.Client).ListRelays, writeRelayTable)
}

// listCommand runs a list command: its flags, one call of the operator API,
// then the answer as JSON (an empty list as []) or as a table.
func listCommand[T any](ctx context.Context, g *ctlGlobals, name string, args []string, stdout, stderr io.Writer,
	fetch func(*control.Client, context.Context) ([]T, error), table func(io.Writer, []T, time.Time) error) error {
	c, err := g.connectFor(name, args, stderr)
	if err != nil {
		return err
	}
	items, err := fetch(c, ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", name, g.explain(err))
	}
	if g.output == outputJSON {
		if items == nil {
			items = []T{}
		}
		return writeJSON(stdout, items)
	}
	return table(stdout, items, time.Now())
}

// showCommand runs a command that shows one thing and takes no argument:
// its flags, one call of the operator API, then the answer as JSON or as
// text.
func showCommand[T any](ctx context.Context, g *ctlGlobals, name string, args []string, stdout, stderr io.Writer,
	fetch func(*control.Client, context.Context) (T, error), text func(io.Writer, T, time.Time) error) error {
	c, err := g.connectFor(name, args, stderr)
	if err != nil {
		return err
	}
	v, err := fetch(c, ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", name, g.explain(err))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, v)
	}
	return text(stdout, v, time.Now())
}

func writeRelayTable(w io.Writer, relays []control.Relay, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tHOSTNAME\tREGION\tADDRESSES\tVERSION\tHEALTHY\tFRESH\tDRAINING\tLAST SEEN\tSESSIONS\tDEVICES")
	for _, r := range relays {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\n",
			r.ID, orDash(r.Hostname), orDash(r.Region), orDash(strings.Join(r.Addresses, ",")), orDash(r.Version),
			yesNo(r.Healthy), yesNo(r.Fresh), drainColumn(r), age(r.LastSeenAt, now),
			r.ForwardSessions, r.MaxForward, r.AttachedDevices)
	}
	return tw.Flush()
}

// drainColumn says whether a relay takes new devices: draining is the
// operator's sticky flag, stopping a relay shutting down.
func drainColumn(r control.Relay) string {
	switch {
	case r.Draining && r.Stopping:
		return "yes, stopping"
	case r.Stopping:
		return "stopping"
	default:
		return yesNo(r.Draining)
	}
}

func relaysDrain(ctx context.Context, g *ctlGlobals, args []string, draining bool, stdout, stderr io.Writer) error {
	verb := "undrain"
	if draining {
		verb = "drain"
	}
	name := "ctl relays " + verb
	fs := newFlagSet(name, stderr)
	g.register(fs)
	var force bool
	if draining {
		fs.BoolVar(&force, "force", false, "drain even the last relay serving, or one whose devices the others have no room for")
	}
	ids, err := parseWithArgs(fs, args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return usageErrorf("%s: give exactly one relay ID (see '%s'), got %d", name, listRelaysCmd, len(ids))
	}
	id := ids[0]
	if !fleet.ValidRelayID(id) {
		return usageErrorf("%s: %q is not a relay ID, which looks like rl-<8 hex digits>; see '%s'", name, id, listRelaysCmd)
	}
	c, err := g.connect()
	if err != nil {
		return err
	}
	var answer control.DrainAnswer
	if draining {
		answer, err = c.DrainRelay(ctx, id, control.DrainRequest{Force: force})
	} else {
		answer, err = c.SetRelayDraining(ctx, id, false)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, g.explainNotFound(err, "relay "+id, listRelaysCmd))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, answer)
	}
	switch {
	case answer.Draining && answer.Warning != "":
		fmt.Fprintln(stdout, answer.Warning)
	case answer.Draining:
		fmt.Fprintf(stdout, "relay %s is draining: it takes no new devices; attached devices move as their agents reconnect\n", answer.ID)
	default:
		fmt.Fprintf(stdout, "relay %s is no longer draining\n", answer.ID)
	}
	return nil
}

// --- devices ---

func runDevices(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return runSubcommand(ctx, g, "ctl devices", args, stdout, stderr, []subcommand{
		{"list", devicesList},
		{"show", devicesShow},
		{"cancel", devicesCancel},
	})
}

func devicesList(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return listCommand(ctx, g, "ctl devices list", args, stdout, stderr, (*control.Client).ListDevices, writeDeviceTable)
}

func writeDeviceTable(w io.Writer, devices []control.Device, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tRELAY\tSTATE\tAGENTS\tPROTOCOL\tATTACHED")
	for _, d := range devices {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", d.Name, orDash(d.RelayID), d.State, d.Agents,
			orDash(d.Protocol), age(d.AttachedAt, now))
	}
	return tw.Flush()
}

// connectFor parses the flags of command, which takes no argument, and
// returns an operator API client.
func (g *ctlGlobals) connectFor(command string, args []string, stderr io.Writer) (*control.Client, error) {
	fs := newFlagSet(command, stderr)
	g.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	return g.connect()
}

// deviceCommand parses the flags of command, which takes exactly one device
// name (checked first when strict), and returns the name and an operator API
// client.
func (g *ctlGlobals) deviceCommand(command string, strict bool, args []string, stderr io.Writer) (string, *control.Client, error) {
	fs := newFlagSet(command, stderr)
	g.register(fs)
	names, err := parseWithArgs(fs, args)
	if err != nil {
		return "", nil, err
	}
	if len(names) != 1 {
		return "", nil, usageErrorf("%s: give exactly one device name (see '%s'), got %d", command, listDevicesCmd, len(names))
	}
	if strict {
		if err := auth.ValidateDeviceName(names[0]); err != nil {
			return "", nil, usageErrorf("%s: %v", command, err)
		}
	}
	c, err := g.connect()
	return names[0], c, err
}

func devicesShow(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	name, c, err := g.deviceCommand("ctl devices show", false, args, stderr)
	if err != nil {
		return err
	}
	link, err := c.Device(ctx, name)
	if err != nil {
		return fmt.Errorf("ctl devices show: %w", g.explainNotFound(err, fmt.Sprintf("device %q", name), listDevicesCmd))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, link)
	}
	return writeDeviceLink(stdout, link, time.Now())
}

func devicesCancel(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	name, c, err := g.deviceCommand("ctl devices cancel", true, args, stderr)
	if err != nil {
		return err
	}
	ans, err := c.CancelDevice(ctx, name)
	if err != nil {
		return fmt.Errorf("ctl devices cancel: %w", g.explain(err))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, ans)
	}
	fmt.Fprintf(stdout, "dropped every session of device %s on every relay; its agents reconnect\n", ans.Device)
	return nil
}

// writeDeviceLink writes a device and the relay that holds it as a block of
// "key value" lines.
func writeDeviceLink(w io.Writer, d control.DeviceLink, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "device\t%s\n", d.Name)
	fmt.Fprintf(tw, "state\t%s\n", d.State)
	fmt.Fprintf(tw, "agents\t%d\n", d.Agents)
	fmt.Fprintf(tw, "protocol\t%s\n", orDash(d.Protocol))
	fmt.Fprintf(tw, "attached\t%s\n", timeAndAge(d.AttachedAt, now))
	fmt.Fprintf(tw, "updated\t%s\n", timeAndAge(d.UpdatedAt, now))
	switch r := d.Relay; {
	case r != nil:
		fmt.Fprintf(tw, "relay\t%s\n", r.ID)
		fmt.Fprintf(tw, "  hostname\t%s\n", orDash(r.Hostname))
		fmt.Fprintf(tw, "  region\t%s\n", orDash(r.Region))
		fmt.Fprintf(tw, "  addresses\t%s\n", orDash(strings.Join(r.Addresses, ", ")))
		fmt.Fprintf(tw, "  fresh\t%s (last seen %s)\n", yesNo(r.Fresh), age(r.LastSeenAt, now))
		fmt.Fprintf(tw, "  draining\t%s\n", drainColumn(*r))
	case d.RelayID != "":
		fmt.Fprintf(tw, "relay\t%s (no longer in the fleet)\n", d.RelayID)
	default:
		fmt.Fprintf(tw, "relay\t-\n")
	}
	return tw.Flush()
}

// --- events ---

func runEvents(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ctl events", stderr)
	g.register(fs)
	limit := fs.Int("limit", control.DefaultEventsLimit, fmt.Sprintf("show the last `N` events (1 to %d)", control.MaxEventsList))
	follow := fs.Bool("follow", false, "after the last events, print new ones as they happen, until interrupted")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *limit < 1 || *limit > control.MaxEventsList {
		return usageErrorf("ctl events: --limit %d: give a number from 1 to %d", *limit, control.MaxEventsList)
	}
	c, err := g.connect()
	if err != nil {
		return err
	}
	if *follow {
		return followEvents(ctx, g, c, *limit, newEventWriter(stdout, g.output == outputJSON))
	}
	events, err := c.Events(ctx, *limit)
	if err != nil {
		return fmt.Errorf("ctl events: %w", g.explain(err))
	}
	if g.output == outputJSON {
		if events == nil {
			events = []control.Event{}
		}
		return writeJSON(stdout, events)
	}
	ew := newEventWriter(stdout, false)
	for _, e := range events {
		if err := ew.write(e); err != nil {
			return err
		}
	}
	return nil
}

// followEvents prints the last limit events, then each new one, until ctx
// ends or the process is interrupted, which is a normal end. The stream is
// requested before the last events are read, so that none falls between
// them: events seen twice are printed once, and events the stream started
// too late for are fetched when the first one after them arrives (event
// sequences have no holes).
func followEvents(ctx context.Context, g *ctlGlobals, c *control.Client, limit int, ew *eventWriter) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	stream := make(chan control.Event)
	done := make(chan struct{})
	var streamErr error // read after done is closed
	go func() {
		defer close(done)
		streamErr = c.FollowEvents(ctx, func(e control.Event) error {
			select {
			case stream <- e:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	defer func() {
		cancel()
		<-done
	}()

	events, err := c.Events(ctx, limit)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ctl events: %w", g.explain(err))
	}
	var last uint64 // the highest sequence printed
	emit := func(e control.Event) error {
		if e.Seq != 0 && e.Seq <= last {
			return nil
		}
		last = max(last, e.Seq)
		return ew.write(e)
	}
	for _, e := range events {
		if err := emit(e); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ctl events --follow: %w", g.explainStreamEnd(streamErr))
		case e := <-stream:
			if e.Seq > last+1 {
				if err := printMissed(ctx, c, last, e.Seq, emit); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("ctl events --follow: %w", g.explain(err))
				}
			}
			if err := emit(e); err != nil {
				return err
			}
		}
	}
}

// explainStreamEnd says why an event stream ended before it was interrupted.
func (g *ctlGlobals) explainStreamEnd(err error) error {
	switch {
	case errors.As(err, new(*control.APIError)), errors.Is(err, control.ErrUnreachable):
		return g.explain(err)
	case err == nil:
		return fmt.Errorf("the relay at %s ended the event stream (is it stopping?)", g.admin)
	default:
		return fmt.Errorf("the event stream from %s broke (is the relay stopping?): %w", g.admin, err)
	}
}

// printMissed prints the events after sequence after and before sequence
// before, which the stream started too late to carry.
func printMissed(ctx context.Context, c *control.Client, after, before uint64, emit func(control.Event) error) error {
	events, err := c.Events(ctx, control.MaxEventsList)
	if err != nil {
		return err
	}
	for _, e := range events {
		if e.Seq > after && e.Seq < before {
			if err := emit(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// eventWriter prints events one per line: as table rows under a header, or
// as one JSON object per line.
type eventWriter struct {
	w    io.Writer
	json *json.Encoder // nil in table mode
}

// eventRowFormat has fixed column widths, so that rows printed as events
// happen line up with the header printed long before.
const eventRowFormat = "%-20s  %-18s  %-11s  %-16s  %s\n"

// newEventWriter returns an eventWriter, having printed the table header in
// table mode.
func newEventWriter(w io.Writer, asJSON bool) *eventWriter {
	if asJSON {
		return &eventWriter{w: w, json: json.NewEncoder(w)}
	}
	fmt.Fprintf(w, eventRowFormat, "TIME", "TYPE", "RELAY", "DEVICE", "MESSAGE")
	return &eventWriter{w: w}
}

func (ew *eventWriter) write(e control.Event) error {
	if ew.json != nil {
		return ew.json.Encode(e)
	}
	when := "-"
	if !e.Time.IsZero() {
		when = e.Time.UTC().Format(time.RFC3339)
	}
	_, err := fmt.Fprintf(ew.w, eventRowFormat, when, orDash(e.Type), orDash(e.RelayID), orDash(e.Device), e.Message)
	return err
}

// --- status ---

func runStatus(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return showCommand(ctx, g, "ctl status", args, stdout, stderr, (*control.Client).Status,
		func(w io.Writer, st control.Status, _ time.Time) error { return writeStatus(w, st) })
}

func writeStatus(w io.Writer, st control.Status) error {
	nats := "connected"
	if !st.NATSConnected {
		nats = "NOT connected: the fleet state shown may be out of date"
	}
	lease := "held by this relay"
	if !st.LeaseHeld {
		lease = "not held by this relay"
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "relay\t%s\n", st.RelayID)
	fmt.Fprintf(tw, "nats\t%s\n", nats)
	fmt.Fprintf(tw, "housekeeping lease\t%s\n", lease)
	fmt.Fprintf(tw, "draining\t%s\n", yesNo(st.ShouldDrain))
	fmt.Fprintf(tw, "relays\t%d (%d fresh, %d draining)\n", st.Relays, st.FreshRelays, st.DrainingRelays)
	fmt.Fprintf(tw, "devices\t%d (%d online)\n", st.Devices, st.OnlineDevices)
	fmt.Fprintf(tw, "events dropped\t%d\n", st.EventsDropped)
	if st.SecretFingerprint != "" {
		fmt.Fprintf(tw, "fleet secret\t%s (from %s)\n", st.SecretFingerprint, orDash(st.SecretSource))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.SecretMismatch) > 0 {
		_, err := fmt.Fprintf(w, "WARNING: relay(s) %s run another fleet secret than the fleet: forwards between them and the other relays are refused; see 'switchboard ctl secret status' and docs/fleet-secret.md\n",
			strings.Join(st.SecretMismatch, ", "))
		return err
	}
	return nil
}

// --- formatting ---

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// age says how long before now t was, in its largest whole unit: "3s ago",
// "5m ago", "2h ago", "4d ago"; "-" for a zero time.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
	}
}

// timeAndAge is t in UTC with its age, or "-" for a zero time.
func timeAndAge(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339) + " (" + age(t, now) + ")"
}
