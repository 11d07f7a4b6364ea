// Package procfleet runs a Switchboard fleet as real processes on loopback,
// for the benchmark harnesses and the tests that must lose a relay the way a
// fleet does: killed with -9, frozen with SIGSTOP, drained and restarted in
// a roll. One `switchboard serve` process per relay, all on one NATS server
// hosted by this process (so that any relay may die) or on NATS servers of
// the caller's (a natscluster); in-process agents, native or long-poll, and
// a backend for them.
//
//	bin, _ := benchkit.Binary("", dir)               // built once
//	f, err := procfleet.Start(ctx, procfleet.Config{Bin: bin, Dir: dir, Relays: 3})
//	defer f.Close()
//	agents := procfleet.NewAgents(ctx)
//	defer agents.Stop()
//	agents.Start(agent.Config{Relays: f.Entries(), Device: "d1", Backend: backend.URL()})
//	f.WaitOnline(ctx, []string{"d1"})
//	victim, held := f.Fullest(dir)                   // dir from f.Online(ctx)
//	victim.Kill()                                    // or Freeze, then Thaw
//	f.Restart(ctx, victim)                           // on its data dir: the same relay id
//	f.Roll(ctx, "v2", os.Stderr)                     // the real `switchboard ctl roll`
//
// Every wait has a deadline and polls; nothing sleeps blind. A relay's
// output goes to Config.Output, or to a log file of its own whose tail
// Logs returns for a failure's report.
package procfleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// Waits the fleet's methods allow, and how often they look.
const (
	readyWithin  = 20 * time.Second // a relay's /readyz after its start
	freshWithin  = 30 * time.Second // every relay seeing every relay fresh
	onlineWithin = 60 * time.Second // every device online
	pollEvery    = 50 * time.Millisecond
	stopGrace    = 30 * time.Second // a SIGTERM'd relay's drain, before SIGKILL
)

// Config says what Start runs.
type Config struct {
	// Bin is the switchboard binary (see benchkit.Binary). Required.
	Bin string
	// Dir holds the relays' data dirs (relayN), the embedded NATS's store,
	// the shared admin token and the logs. Required.
	Dir string
	// Relays is how many relays to start. Default 3.
	Relays int
	// NATS are the URLs of NATS servers the relays share. Default: one
	// embedded server, in this process, at Dir/nats.
	NATS []string
	// Host returns relay n's (1, 2, …) loopback address. Default
	// 127.0.0.1 for every relay.
	Host func(n int) string
	// Named starts relay n with --relay-name relay-N, so that its id is
	// derived from the name. Default: the id the relay keeps in its data dir.
	Named bool
	// Version is what the relays report (--report-version) until a roll
	// changes it. Default: their build's.
	Version string
	// LogLevel is the relays' --log-level. Default error.
	LogLevel string
	// Args are added to every relay's command line.
	Args []string
	// Output receives every relay's output. Default: a file per relay in
	// Dir, relayN.log, whose tail Logs returns.
	Output io.Writer
}

// Complete fills in the defaults.
func (c *Config) Complete() {
	if c.Relays == 0 {
		c.Relays = 3
	}
	if c.Host == nil {
		c.Host = func(int) string { return "127.0.0.1" }
	}
	if c.LogLevel == "" {
		c.LogLevel = "error"
	}
}

// Validate rejects a config Start cannot run.
func (c *Config) Validate() error {
	switch {
	case c.Bin == "":
		return errors.New("procfleet: no switchboard binary (Config.Bin)")
	case c.Dir == "":
		return errors.New("procfleet: no directory (Config.Dir)")
	case c.Relays < 1:
		return fmt.Errorf("procfleet: %d relays: want at least one", c.Relays)
	}
	return nil
}

// Fleet is a running fleet of relay processes.
type Fleet struct {
	cfg    Config
	token  string
	client *http.Client

	mu     sync.Mutex // guards the fields below
	relays []*Relay
	nats   *store.Store // the embedded NATS, nil when Config.NATS names servers or it is stopped
	natsAt []string     // the relays' --nats
}

// Start runs the NATS server (unless cfg names some) and cfg.Relays relays,
// one after the other, and waits until every relay sees every relay fresh.
func Start(ctx context.Context, cfg Config) (f *Fleet, err error) {
	cfg.Complete()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f = &Fleet{cfg: cfg, natsAt: cfg.NATS,
		client: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, f.Logs(20))
			f.Close()
		}
	}()
	if len(f.natsAt) == 0 {
		if err := f.StartNATS(ctx); err != nil {
			return f, err
		}
	}
	for range cfg.Relays {
		if _, err := f.AddRelay(ctx); err != nil {
			return f, err
		}
	}
	return f, f.WaitFresh(ctx)
}

// Token is the admin token every relay runs with.
func (f *Fleet) Token() string { return f.token }

// TokenFile is the file holding Token.
func (f *Fleet) TokenFile() string { return filepath.Join(f.cfg.Dir, "admin.token") }

// Relays returns the fleet's relays, in the order they were added.
func (f *Fleet) Relays() []*Relay {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.relays)
}

// Entries returns the relays' public URLs, for an agent's relay list.
func (f *Fleet) Entries() []*url.URL {
	var out []*url.URL
	for _, r := range f.Relays() {
		u, _ := url.Parse(r.URL())
		out = append(out, u)
	}
	return out
}

// NATSURLs returns the relays' --nats.
func (f *Fleet) NATSURLs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.natsAt)
}

// StartNATS starts the embedded NATS server, again on its first address
// and store after StopNATS.
func (f *Fleet) StartNATS(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	listen := "127.0.0.1:0"
	if len(f.natsAt) > 0 {
		u, err := url.Parse(f.natsAt[0])
		if err != nil {
			return fmt.Errorf("procfleet: NATS address: %w", err)
		}
		listen = u.Host
	}
	st, err := store.Open(ctx, store.Config{DataDir: filepath.Join(f.cfg.Dir, "nats"), Listen: listen})
	if err != nil {
		return fmt.Errorf("procfleet: start NATS: %w", err)
	}
	f.nats, f.natsAt = st, []string{st.ClientURL()}
	return nil
}

// StopNATS stops the embedded NATS server: the relays lose it.
func (f *Fleet) StopNATS() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nats != nil {
		f.nats.Close()
		f.nats = nil
	}
}

// AddRelay starts one more relay, numbered after the others, and waits
// until it is ready.
func (f *Fleet) AddRelay(ctx context.Context) (*Relay, error) {
	f.mu.Lock()
	n := len(f.relays) + 1
	host := f.cfg.Host(n)
	r := &Relay{N: n, Host: host, Port: freePortOn(host), AdminPort: freePortOn(host),
		Dir: filepath.Join(f.cfg.Dir, fmt.Sprintf("relay%d", n)), version: f.cfg.Version}
	if f.cfg.Output == nil {
		r.log = filepath.Join(f.cfg.Dir, fmt.Sprintf("relay%d.log", n))
	}
	f.mu.Unlock()
	err := f.start(ctx, r)
	for try := 1; err != nil && try < startTries && r.exited(); try++ {
		// Most likely a port taken between freePortOn and the relay's
		// listen, by another test's process: take two others.
		r.Port, r.AdminPort = freePortOn(host), freePortOn(host)
		err = f.start(ctx, r)
	}
	f.mu.Lock()
	f.relays = append(f.relays, r) // once its id is known; even when it failed, for Logs
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if n == 1 {
		// The first relay writes the admin token the others read.
		b, err := os.ReadFile(f.TokenFile())
		if err != nil {
			return nil, err
		}
		f.token = strings.TrimSpace(string(b))
	}
	return r, nil
}

// Restart starts a relay that was killed or stopped again, on its data
// dir (the same relay id), reporting r.Version, and waits until it is ready.
func (f *Fleet) Restart(ctx context.Context, r *Relay) error {
	if p := r.process(); p != nil && !p.Exited() {
		return fmt.Errorf("procfleet: relay %d is still running", r.N)
	}
	return f.start(ctx, r)
}

// start runs relay r's process and waits until /readyz answers 200.
func (f *Fleet) start(ctx context.Context, r *Relay) error {
	args := []string{"serve", "--listen", net.JoinHostPort(r.Host, r.Port), "--admin-listen", net.JoinHostPort(r.Host, r.AdminPort),
		"--data", r.Dir, "--nats", strings.Join(f.NATSURLs(), ","), "--advertise", r.URL(),
		"--admin-token-file", f.TokenFile(),
		"--allow-anonymous-users", "--allow-anonymous-agents", "--log-level", f.cfg.LogLevel}
	if f.cfg.Named {
		args = append(args, "--relay-name", fmt.Sprintf("relay-%d", r.N))
	}
	if v := r.nextVersion(); v != "" {
		args = append(args, "--report-version", v)
	}
	args = append(args, f.cfg.Args...)
	out := f.cfg.Output
	if r.log != "" {
		lf, err := os.OpenFile(r.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer lf.Close() // the child holds its own descriptor
		out = lf
	}
	p, err := StartProc(fmt.Sprintf("relay %d", r.N), f.cfg.Bin, args, out)
	if err != nil {
		return err
	}
	r.setProcess(p)
	err = benchkit.Poll(ctx, readyWithin, pollEvery, func() error {
		if err := p.Err(); err != nil {
			return err
		}
		return get(f.client, r.AdminURL()+"/readyz")
	})
	if err != nil {
		return fmt.Errorf("relay %d did not start: %w", r.N, err)
	}
	if r.ID == "" {
		if f.cfg.Named {
			r.ID = fleet.RelayIDFromName(fmt.Sprintf("relay-%d", r.N))
		} else {
			id, err := os.ReadFile(filepath.Join(r.Dir, fleet.RelayIDFile))
			if err != nil {
				return err
			}
			r.ID = strings.TrimSpace(string(id))
		}
	}
	r.up.Store(true)
	return nil
}

// API returns an operator API client on the first relay that is up other
// than skip (any relay when skip is nil); nil when none is.
func (f *Fleet) API(skip *Relay) *control.Client {
	for _, r := range f.Relays() {
		if r != skip && r.Up() {
			return f.APIOf(r)
		}
	}
	return nil
}

// APIOf returns an operator API client on relay r.
func (f *Fleet) APIOf(r *Relay) *control.Client {
	return &control.Client{BaseURL: r.AdminURL(), Token: f.token, HTTPClient: f.client}
}

// ErrNoRelay is returned when no relay is up to ask.
var ErrNoRelay = errors.New("procfleet: no relay is up")

// devices lists the devices through a relay that is up.
func (f *Fleet) devices(ctx context.Context) ([]control.Device, error) {
	c := f.API(nil)
	if c == nil {
		return nil, ErrNoRelay
	}
	return c.ListDevices(ctx)
}

// Directory returns device → relay id for every device with an agent
// attached.
func (f *Fleet) Directory(ctx context.Context) (map[string]string, error) {
	ds, err := f.devices(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range ds {
		if d.Agents > 0 {
			out[d.Name] = d.RelayID
		}
	}
	return out, nil
}

// Online returns device → relay id for every device online: attached to a
// fresh relay.
func (f *Fleet) Online(ctx context.Context) (map[string]string, error) {
	ds, err := f.devices(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range ds {
		if d.State == fleet.StateOnline {
			out[d.Name] = d.RelayID
		}
	}
	return out, nil
}

// Fullest returns the relay that holds the most devices of dir (device →
// relay id) and its devices, sorted; the first such relay on a tie.
func (f *Fleet) Fullest(dir map[string]string, among ...*Relay) (*Relay, []string) {
	if len(among) == 0 {
		among = f.Relays()
	}
	held := map[string][]string{}
	for d, id := range dir {
		held[id] = append(held[id], d)
	}
	var victim *Relay
	for _, r := range among {
		if victim == nil || len(held[r.ID]) > len(held[victim.ID]) {
			victim = r
		}
	}
	slices.Sort(held[victim.ID])
	return victim, held[victim.ID]
}

// WaitFresh waits until every relay that is up sees as many relays fresh
// and not draining.
func (f *Fleet) WaitFresh(ctx context.Context) error {
	var up []*Relay
	for _, r := range f.Relays() {
		if r.Up() {
			up = append(up, r)
		}
	}
	return benchkit.Poll(ctx, freshWithin, pollEvery, func() error {
		for _, r := range up {
			fresh, err := benchkit.FreshRelays(ctx, f.APIOf(r))
			if err != nil {
				return err
			}
			if fresh < len(up) {
				return fmt.Errorf("relay %d sees %d fresh relays of %d", r.N, fresh, len(up))
			}
		}
		return nil
	})
}

// WaitOnline waits until every one of devices is online.
func (f *Fleet) WaitOnline(ctx context.Context, devices []string) error {
	return benchkit.Poll(ctx, onlineWithin, pollEvery, func() error {
		dir, err := f.Online(ctx)
		if err != nil {
			return err
		}
		online := 0
		for _, d := range devices {
			if _, ok := dir[d]; ok {
				online++
			}
		}
		if online < len(devices) {
			return fmt.Errorf("%d of %d devices online", online, len(devices))
		}
		return nil
	})
}

// Logs returns the last lines of every relay's log file, for a failure's
// report; empty when the relays write to Config.Output.
func (f *Fleet) Logs(lines int) string {
	var b strings.Builder
	for _, r := range f.Relays() {
		if r.log != "" {
			fmt.Fprintf(&b, "--- relay %d (%s), last %d lines:\n%s\n", r.N, r.ID, lines, tail(r.log, lines))
		}
	}
	return b.String()
}

// Close kills every relay and stops the embedded NATS server.
func (f *Fleet) Close() {
	for _, r := range f.Relays() {
		if p := r.process(); p != nil {
			r.up.Store(false)
			p.Kill()
		}
	}
	f.StopNATS()
	f.client.CloseIdleConnections()
}

// get wants a 200 from u.
func get(c *http.Client, u string) error {
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return nil
}

// startTries bounds the starts of a new relay whose process exits before
// it is ready.
const startTries = 3

// freePortOn returns a TCP port free on host a moment ago.
func freePortOn(host string) string {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return benchkit.FreePort()
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}
