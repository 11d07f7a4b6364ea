package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/switchboard-relay/switchboard/internal/config"
)

// Defaults of Config.
const (
	DefaultBeatInterval = 2 * time.Second
	DefaultFreshBeats   = 3
	DefaultMaxForward   = 512
	DefaultLostWindow   = 15 * time.Minute
	DefaultReapAfter    = 7 * 24 * time.Hour
	DefaultLeaseTTL     = 3 * time.Second
)

// Local is what a Member needs to know about its own relay.
type Local interface {
	// Presence returns the devices this relay holds agents for right now.
	Presence() map[string]Presence
	// AgentSessions counts agent connections (tunnels and long-poll agents).
	AgentSessions() int
	// Healthy is the relay's own view of its health.
	Healthy() bool
	// Stopping reports whether the relay is shutting down (SIGTERM): it
	// takes no new devices. Unlike a drain, it is not sticky: the relay's
	// next life beats without it.
	Stopping() bool
}

// Config configures a Member. Zero fields take the defaults named on them.
type Config struct {
	// RelayID is this relay's id (rl-<8 hex>); see LoadOrCreateRelayID.
	RelayID string
	// Hostname, Region, Addresses and Version are reported on each beat.
	Hostname  string
	Region    string
	Addresses []string
	Version   string
	// BeatInterval is how often the relay heartbeats. Default 2 s.
	BeatInterval time.Duration
	// FreshAfter is how recent a relay's last beat must be for it to count
	// as fresh, in this relay's view of the fleet: while its own beats stop
	// coming back through NATS, ages are taken when the view froze
	// (freshness.go). Default 3 beat intervals.
	FreshAfter time.Duration
	// MaxForward is the ceiling of devices this relay takes. Default 512.
	MaxForward int
	// LostWindow: a relay stale this long is lost, and housekeeping detaches
	// its devices in the directory. Default 15 min.
	LostWindow time.Duration
	// ReapAfter: housekeeping removes relays with no beat for this long and
	// nothing attached, and devices detached this long. Default 7 days.
	ReapAfter time.Duration
	// LeaseTTL is the length of the housekeeping lease; it is renewed every
	// third of it, so another node takes over at most LeaseTTL plus a third
	// after its holder dies. Default 3 s.
	LeaseTTL time.Duration
	// Secret is the fleet secret this relay runs (package fleetsecret),
	// reported on each heartbeat and kept in step with the relay set and
	// housekeeping. Default: none, reported as none.
	Secret Secret
	// Local reports this relay's own state. Required.
	Local Local
	// OnShouldDrain is called when the stored drain flag of this relay
	// changes, with its new value, e.g. after an operator's drain. Optional;
	// it must not block.
	OnShouldDrain func(draining bool)
	// OnChange is called after each change to the relay set or the device
	// directory this member mirrors. Optional; it must not block.
	OnChange func()
	// OnMove is told of each device that moved to this relay: from where,
	// and how long since its agent lost the previous relay (0 when the
	// agent did not say). Optional; it must not block.
	OnMove func(device, from string, took time.Duration)
	// OnCancel is called when the fleet asks this relay to drop every
	// session of a device: an operator's CancelDevice (moved false), or
	// another relay that took the device (moved true: requests in flight
	// may finish). Optional; it must not block long.
	OnCancel func(device, reason string, moved bool)
	// OnSendBack is called when relay by asks this relay to send the
	// device's native agents back through the front door (Member.SendBack).
	// Optional; it must not block long.
	OnSendBack func(device, by string)
	// Standbys returns the devices this relay keeps standby tunnels for,
	// which it records in the directory. Optional: nil keeps none.
	Standbys func() map[string]int
	// OnPromote is called when relay from, the holder of device, asks
	// this relay to promote its standby for the device (a drain).
	// Optional; it must not block long.
	OnPromote func(device, from string)
	// OnRecordedHere is called when the directory records this relay as
	// the holder of a device it keeps only standby tunnels for: a
	// promotion's write that timed out but landed. The relay promotes
	// them, since the fleet now routes the device here. Optional; it must
	// not block long.
	OnRecordedHere func(device string)
	// OnHandOver is called when relay to took device by promoting its
	// standby tunnel: this relay stops sending the device requests and
	// lets those in flight finish, and the agent retires its tunnel here.
	// Optional (default OnCancel's move); it must not block long.
	OnHandOver func(device, to string)
	// Answering reports whether this relay hears from relay id directly
	// now (its watchdog's probes answer): Route keeps sending requests to
	// a device's recorded holder whose heartbeats stopped reaching NATS
	// while it answers, since it still holds the device's agents.
	// Optional: nil trusts heartbeats alone.
	Answering func(id string) bool
	// Logger receives transitions; nil discards.
	Logger *slog.Logger
}

// Complete fills in defaults.
func (c *Config) Complete() {
	if c.BeatInterval <= 0 {
		c.BeatInterval = DefaultBeatInterval
	}
	if c.FreshAfter <= 0 {
		c.FreshAfter = DefaultFreshBeats * c.BeatInterval
	}
	if c.MaxForward <= 0 {
		c.MaxForward = DefaultMaxForward
	}
	if c.LostWindow <= 0 {
		c.LostWindow = DefaultLostWindow
	}
	if c.ReapAfter <= 0 {
		c.ReapAfter = DefaultReapAfter
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.OnShouldDrain == nil {
		c.OnShouldDrain = func(bool) {}
	}
	if c.OnChange == nil {
		c.OnChange = func() {}
	}
	if c.OnMove == nil {
		c.OnMove = func(string, string, time.Duration) {}
	}
	if c.OnCancel == nil {
		c.OnCancel = func(string, string, bool) {}
	}
	if c.OnSendBack == nil {
		c.OnSendBack = func(string, string) {}
	}
	if c.Secret == nil {
		c.Secret = noSecret{}
	}
	if c.Standbys == nil {
		c.Standbys = func() map[string]int { return nil }
	}
	if c.OnHandOver == nil {
		onCancel := c.OnCancel
		c.OnHandOver = func(device, to string) { onCancel(device, "the device moved to relay "+to, true) }
	}
	if c.OnPromote == nil {
		c.OnPromote = func(string, string) {}
	}
	if c.OnRecordedHere == nil {
		c.OnRecordedHere = func(string) {}
	}
	if c.Answering == nil {
		c.Answering = func(string) bool { return false }
	}
}

// Secret is the fleet secret a relay runs, as its Member needs it: what
// each heartbeat reports, and the calls that keep it in step with the
// fleet state. Package fleetsecret's Keeper implements it.
type Secret interface {
	// Report returns what a heartbeat says of the secret: the fingerprint
	// the relay signs with, those it accepts (the signing one first), and
	// where they come from ("fleet" or "file").
	Report() (fingerprint string, accepted []string, source string)
	// RelaysChanged is called after each change of the relay set. It must
	// not block.
	RelaysChanged()
	// Sweep is called by the housekeeping lease holder after each of its
	// sweeps; taken is true on the first since it took the lease.
	Sweep(ctx context.Context, taken bool)
	// Resync is called whenever the member reads the fleet state again
	// from NATS: after a reconnect, and when NATS is reachable again.
	Resync()
}

// noSecret is the Secret of a Member configured without one.
type noSecret struct{}

func (noSecret) Report() (string, []string, string) { return "", nil, "" }
func (noSecret) RelaysChanged()                     {}
func (noSecret) Sweep(context.Context, bool)        {}
func (noSecret) Resync()                            {}

// Validate rejects a configuration that cannot work. Its errors are
// *config.FieldError, in the words of this Config's fields.
func (c *Config) Validate() error {
	var errs []error
	if !ValidRelayID(c.RelayID) {
		errs = append(errs, config.Invalidf(component, "RelayID", "%q is not of the form rl-<8 hex>", c.RelayID))
	}
	if c.Local == nil {
		errs = append(errs, config.Invalidf(component, "Local", "is required"))
	}
	if c.FreshAfter < c.BeatInterval {
		errs = append(errs, config.Invalid(component, "FreshAfter", func(name func(string) string) string {
			return fmt.Sprintf("%s is shorter than %s %s: every relay would look stale", c.FreshAfter, name("BeatInterval"), c.BeatInterval)
		}))
	}
	if c.LostWindow < c.FreshAfter {
		errs = append(errs, config.Invalid(component, "LostWindow", func(name func(string) string) string {
			return fmt.Sprintf("%s is shorter than %s %s", c.LostWindow, name("FreshAfter"), c.FreshAfter)
		}))
	}
	return errors.Join(errs...)
}

// component names the fleet member in its configuration errors.
const component = "fleet"
