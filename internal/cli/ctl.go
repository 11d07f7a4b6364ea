package cli

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/tlsconf"
)

// Defaults of the ctl global flags: those of a relay started with none.
const (
	defaultAdminURL  = "http://" + node.DefaultAdminListen
	defaultTokenFile = node.DefaultDataDir + "/" + node.AdminTokenFileName
	ctlTimeout       = 30 * time.Second // bounds each call, as control.Client's default
)

// Output formats of ctl.
const (
	outputTable = "table"
	outputJSON  = "json"
)

const ctlUsage = `usage: switchboard ctl [--admin URL] [--token-file PATH] [--ca-file PATH] [-o table|json] <command>

commands:
  relays list           list the relays of the fleet, fresh or not
  relays drain ID       hold a relay out of routing: its devices move to the others, nothing is cut;
                        refused for the last relay serving or without room elsewhere, unless --force
  relays undrain ID     let a drained relay take devices again
  devices list          list the devices in the directory and the relays holding them
  devices show NAME     show one device and its relay
  devices cancel NAME   drop every session of a device on every relay; its agents reconnect
  topics                list the broadcast topics on this relay: readers, relays fed, drops
  ports add PORT DEVICE/SERVICE [--udp] [--allow CIDR,...] [--max-connections N] [--proxy-protocol]
                        listen on PORT on every relay and carry each connection to the service
  ports list            list the mapped ports
  ports remove PORT [--udp]
                        unmap a port: every relay closes it
  tokens create --device NAME [--device NAME...] [--name TEXT]
                        create an agent token that may serve these devices
  tokens create --user NAME [--device NAME...]
                        create a user token (no --device: every device;
                        --device NAME/SERVICE: that service alone, by connect)
  tokens list           list tokens (never their secrets)
  tokens revoke ID      revoke a token on every relay; what it let in is cut
  codes create DEVICE [--path P] [--ttl 30s] [--url BASE]
                        a single-use access code (at most 60 s) to open DEVICE in a
                        browser or a websocket without a token; works with a user token
  events [--limit N] [--follow]
                        show the fleet's last events; --follow prints new ones until Ctrl-C
  status                summarise the fleet as the relay at --admin sees it
  roll --update-cmd CMD [--expect-version V]
                        update every relay, one at a time, each held out of routing
                        until it is empty, updated and back; resumable
  roll enable|disable   allow or forbid rolling updates for the fleet (off at first)
  roll status           show whether rolls are allowed and the roll in progress
  secret status         show the fleet secret's fingerprints and which relays run which
  secret rotate [--grace 8h]
                        replace the fleet secret without downtime: accept, sign, drop; resumable
  stop [--wait 60s]     drain the relay at --admin as SIGTERM would, and wait until it
                        has exited (a Kubernetes preStop hook)

--device takes names or globs such as robot-*, repeated or comma-separated.
The global flags may also follow the command. -o json output is stable; see
docs/cli-json.md.

flags:
`

// ctlCommands are the ctl commands this build has.
const ctlCommands = "relays, devices, topics, ports, tokens, codes, events, status, roll, secret, stop"

// ctlGlobals are the flags every ctl command takes.
type ctlGlobals struct {
	admin     string
	tokenFile string
	caFile    string // CAs of an https:// admin listener; empty = the system roots
	output    string
}

// register binds the global flags to fs, with their current values as defaults,
// so that they may come before or after the command.
func (g *ctlGlobals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.admin, "admin", g.admin, "operator API `URL` of any relay")
	fs.StringVar(&g.tokenFile, "token-file", g.tokenFile, "`file` holding the admin token (a relay writes <data>/admin.token)")
	fs.StringVar(&g.caFile, "ca-file", g.caFile, "PEM `file` of the CAs that sign an https:// admin listener's certificate; empty = the system roots")
	fs.StringVar(&g.output, "o", g.output, "output `format`: table or json")
}

func (g *ctlGlobals) validate() error {
	if g.output != outputTable && g.output != outputJSON {
		return usageErrorf("-o %q: use table or json", g.output)
	}
	return nil
}

// client returns an operator API client with the admin token from the token file.
func (g *ctlGlobals) client() (*control.Client, error) {
	base := g.admin
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	if u, err := url.Parse(base); err != nil || u.Host == "" {
		return nil, usageErrorf("--admin %q: give the relay's admin URL, e.g. %s", g.admin, defaultAdminURL)
	}
	data, err := os.ReadFile(g.tokenFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading the admin token: %w; pass --token-file with the admin.token from a relay's data directory (a relay writes <data>/admin.token on first start)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the admin token: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return nil, fmt.Errorf("the admin token file %s is empty; pass --token-file with a relay's <data>/admin.token", g.tokenFile)
	}
	c := &control.Client{BaseURL: base, Token: token}
	if g.caFile != "" {
		tc, err := tlsconf.Client(g.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		c.HTTPClient = &http.Client{Timeout: ctlTimeout, Transport: &http.Transport{
			Proxy:             http.ProxyFromEnvironment,
			TLSClientConfig:   tc,
			ForceAttemptHTTP2: true,
		}}
	}
	return c, nil
}

// explain adds what a person can do about a failed API call.
func (g *ctlGlobals) explain(err error) error {
	var apiErr *control.APIError
	switch {
	case errors.As(err, new(*tls.CertificateVerificationError)):
		return fmt.Errorf("%w (the admin listener's certificate is not trusted here; pass --ca-file with the CA that signed it)", err)
	case errors.Is(err, control.ErrUnreachable):
		return fmt.Errorf("%w (is a relay's admin listener at %s? set --admin)", err, g.admin)
	case errors.As(err, &apiErr) && (apiErr.Status == http.StatusUnauthorized || apiErr.Status == http.StatusForbidden):
		return fmt.Errorf("%w (the token came from %s; set --token-file)", err, g.tokenFile)
	default:
		return err
	}
}

// runCtl runs 'switchboard ctl'.
func runCtl(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	g := &ctlGlobals{admin: defaultAdminURL, tokenFile: defaultTokenFile, output: outputTable}
	fs := newFlagSet("ctl", stderr)
	g.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), ctlUsage)
		fs.PrintDefaults()
	}
	rest, err := parseLeadingFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		fs.Usage()
		return usageErrorf("ctl: no command given; available: %s", ctlCommands)
	}
	switch rest[0] {
	case "relays":
		return runRelays(ctx, g, rest[1:], stdout, stderr)
	case "devices":
		return runDevices(ctx, g, rest[1:], stdout, stderr)
	case "topics":
		return runTopics(ctx, g, rest[1:], stdout, stderr)
	case "ports":
		return runPorts(ctx, g, rest[1:], stdout, stderr)
	case "tokens":
		return runTokens(ctx, g, rest[1:], stdout, stderr)
	case "codes":
		return runCodes(ctx, g, rest[1:], stdout, stderr)
	case "events":
		return runEvents(ctx, g, rest[1:], stdout, stderr)
	case "status":
		return runStatus(ctx, g, rest[1:], stdout, stderr)
	case "roll":
		return runRoll(ctx, g, rest[1:], stdout, stderr)
	case "secret":
		return runSecret(ctx, g, rest[1:], stdout, stderr)
	case "stop":
		return runStop(ctx, g, rest[1:], stdout, stderr)
	default:
		return usageErrorf("ctl: unknown command %q; available: %s", rest[0], ctlCommands)
	}
}

// parseLeadingFlags parses the flags before the first argument that is not
// one and returns the arguments from there on.
func parseLeadingFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &UsageError{Err: err}
	}
	return fs.Args(), nil
}

// parseWithArgs parses flags that may appear before, between or after the
// positional arguments, and returns the positional arguments.
func parseWithArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		rest, err := parseLeadingFlags(fs, args)
		if err != nil || len(rest) == 0 {
			return positional, err
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

func runTokens(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	return runSubcommand(ctx, g, "ctl tokens", args, stdout, stderr, []subcommand{
		{"create", tokensCreate},
		{"list", tokensList},
		{"revoke", tokensRevoke},
	})
}

// subcommand is one of a ctl command's commands: run gets the arguments
// after its name.
type subcommand struct {
	name string
	run  func(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error
}

// runSubcommand runs the one of subs that args names, for the command cmd
// ("ctl tokens"), or says which there are.
func runSubcommand(ctx context.Context, g *ctlGlobals, cmd string, args []string, stdout, stderr io.Writer, subs []subcommand) error {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.name
	}
	choices := names[len(names)-1]
	if len(names) > 1 {
		choices = strings.Join(names[:len(names)-1], ", ") + " or " + choices
	}
	if len(args) == 0 {
		return usageErrorf("%s: no command given; use %s", cmd, choices)
	}
	for _, s := range subs {
		if s.name == args[0] {
			return s.run(ctx, g, args[1:], stdout, stderr)
		}
	}
	return usageErrorf("%s: unknown command %q; use %s", cmd, args[0], choices)
}

// deviceList is a repeatable flag whose values may also be comma-separated.
type deviceList []string

func (d *deviceList) String() string { return strings.Join(*d, ",") }

func (d *deviceList) Set(v string) error {
	*d = append(*d, splitList(v)...)
	return nil
}

func tokensCreate(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ctl tokens create", stderr)
	g.register(fs)
	var devices deviceList
	fs.Var(&devices, "device", "device `NAME` or glob: those an agent serves, or those a user may use (repeatable, or comma-separated)")
	user := fs.String("user", "", "create a user token for the user `NAME` instead of an agent token")
	name := fs.String("name", "", "a `label` for an agent token, shown by 'tokens list'")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	req, err := tokenRequest(*user, *name, devices)
	if err != nil {
		return err
	}
	if err := g.validate(); err != nil {
		return err
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	created, err := c.CreateToken(ctx, req)
	if err != nil {
		return fmt.Errorf("ctl tokens create: %w", g.explain(err))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, created)
	}
	fmt.Fprintln(stdout, created.Token)
	fmt.Fprintf(stderr, "created %s token %s (%s); the secret above is shown only this once\n",
		created.Kind, created.ID, describeDevices(created.Kind, created.Devices))
	return nil
}

// tokenRequest builds the request of 'tokens create' from its flags.
func tokenRequest(user, name string, devices []string) (control.TokenRequest, error) {
	switch {
	case user != "" && name != "":
		return control.TokenRequest{}, usageErrorf("ctl tokens create: --name labels agent tokens; a user token is named by --user")
	case user != "":
		return control.TokenRequest{Kind: auth.KindUser, Name: user, Devices: devices}, nil
	case len(devices) == 0:
		return control.TokenRequest{}, usageErrorf("ctl tokens create: give --device NAME for an agent token, or --user NAME for a user token")
	default:
		return control.TokenRequest{Kind: auth.KindAgent, Name: name, Devices: devices}, nil
	}
}

func tokensList(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ctl tokens list", stderr)
	g.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := g.validate(); err != nil {
		return err
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	toks, err := c.ListTokens(ctx)
	if err != nil {
		return fmt.Errorf("ctl tokens list: %w", g.explain(err))
	}
	if g.output == outputJSON {
		if toks == nil {
			toks = []control.Token{}
		}
		return writeJSON(stdout, toks)
	}
	return writeTokenTable(stdout, toks)
}

func writeTokenTable(w io.Writer, toks []control.Token) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tNAME\tDEVICES\tCREATED\tSTATUS")
	for _, t := range toks {
		status := "active"
		if t.Revoked {
			status = "revoked"
		}
		name := t.Name
		if name == "" {
			name = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Kind, name,
			deviceColumn(t), t.CreatedAt.UTC().Format(time.RFC3339), status)
	}
	return tw.Flush()
}

func tokensRevoke(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ctl tokens revoke", stderr)
	g.register(fs)
	ids, err := parseWithArgs(fs, args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return usageErrorf("ctl tokens revoke: give exactly one token ID (see 'ctl tokens list'), got %d", len(ids))
	}
	if err := g.validate(); err != nil {
		return err
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	if err := c.RevokeToken(ctx, ids[0]); err != nil {
		return fmt.Errorf("ctl tokens revoke: %w", g.explain(err))
	}
	if g.output == outputJSON {
		return writeJSON(stdout, map[string]any{"id": ids[0], "revoked": true})
	}
	fmt.Fprintf(stdout, "revoked token %s\n", ids[0])
	return nil
}

// deviceColumn is a token's device list as the table shows it.
func deviceColumn(t control.Token) string {
	switch {
	case len(t.Devices) > 0:
		return strings.Join(t.Devices, ",")
	case t.Kind == auth.KindUser:
		return "(all)"
	default:
		return "-"
	}
}

// describeDevices says in words what a token's device list grants.
func describeDevices(kind auth.Kind, devices []string) string {
	switch {
	case len(devices) > 0 && kind == auth.KindAgent:
		return "serves " + strings.Join(devices, ", ")
	case len(devices) > 0:
		return "may use " + strings.Join(devices, ", ")
	case kind == auth.KindUser:
		return "may use every device"
	default:
		return "no devices"
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
