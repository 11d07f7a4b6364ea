package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"time"

	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
	"github.com/switchboard-relay/switchboard/internal/watchdog"
)

// Config configures a relay node. Zero fields take the defaults named on them.
type Config struct {
	// Listen is the public address for users and agents. Default ":8080".
	Listen string
	// AdminListen is the operator API, admin page and metrics address.
	// Default "127.0.0.1:9090".
	AdminListen string
	// DataDir holds the embedded NATS store and the admin token.
	// Default "./switchboard-data".
	DataDir string
	// NATS are external NATS URLs; empty starts an embedded NATS server.
	NATS []string
	// NATSListen is where the embedded NATS server also accepts other
	// relays; empty keeps it in-process only.
	NATSListen string
	// Advertise is the URL other relays and agents use to reach this relay;
	// empty derives it from the public listener.
	Advertise string
	// Region labels the relay for the ranking (same region first).
	Region string
	// Watchdog sets how this relay probes its peers and how long a veto
	// lasts; see watchdog.Config (Peers and Probe are filled in).
	Watchdog watchdog.Config
	// Fleet holds the heartbeat, freshness, lease and reaping settings; the
	// node fills in the relay's identity. See fleet.Config.
	Fleet fleet.Config
	// AllowAnonymousUsers lets users in without a token. Default off.
	AllowAnonymousUsers bool
	// AllowAnonymousAgents lets agents serve any device without a token.
	// Default off.
	AllowAnonymousAgents bool
	// Broker holds the long-poll timeouts and limits; see broker.Config.
	Broker broker.Config
	// Liveness sets the native tunnels' pings; see tunnel.Liveness.
	Liveness tunnel.Liveness
	// MaxChunkBytes caps one response chunk posted by a long-poll agent.
	// Default 16 MiB.
	MaxChunkBytes int
	// MaxHeaderBytes caps a request's header block on every listener.
	// Default 64 KiB.
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds how long a client may take to send its
	// headers, so that slow clients cannot hold connections. Default 10 s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long. Default 120 s.
	IdleTimeout time.Duration
	// DrainTimeout bounds a graceful shutdown: requests and streams still
	// running after it are cut. Default 25 s, inside a 30 s termination grace.
	DrainTimeout time.Duration
	// ShutdownDelay is how long a shutting-down relay keeps its public
	// listener open at least after /readyz turned false, so that load
	// balancers stop sending before it closes. Default 1 s.
	ShutdownDelay time.Duration
	// DrainSpread is the window over which a drained relay asks its native
	// agents to move, so that the other relays are not stormed. Default 5 s.
	DrainSpread time.Duration
	// Version is reported in metrics and logs.
	Version string
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
}

// Complete fills in defaults for zero fields.
func (c *Config) Complete() {
	if c.Listen == "" {
		c.Listen = ":8080"
	}
	if c.AdminListen == "" {
		c.AdminListen = "127.0.0.1:9090"
	}
	if c.DataDir == "" {
		c.DataDir = "./switchboard-data"
	}
	if c.MaxChunkBytes <= 0 {
		c.MaxChunkBytes = 16 << 20
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 64 << 10
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 25 * time.Second
	}
	if c.ShutdownDelay <= 0 {
		c.ShutdownDelay = time.Second
	}
	if c.DrainSpread <= 0 {
		c.DrainSpread = 5 * time.Second
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Broker.Complete()
}

// Validate rejects settings that cannot work, saying how to fix them.
func (c *Config) Validate() error {
	var errs []error
	for _, l := range []struct{ flag, addr string }{{"--listen", c.Listen}, {"--admin-listen", c.AdminListen}} {
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q is not host:port (e.g. :8080 or 127.0.0.1:9090)", l.flag, l.addr))
		}
	}
	if c.Advertise != "" {
		if u, err := url.Parse(c.Advertise); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--advertise %q is not an http:// or https:// URL with a host (e.g. https://relay-1.example.com)", c.Advertise))
		}
	}
	if c.Fleet.MaxForward < 0 {
		errs = append(errs, fmt.Errorf("--max-forward %d: give a positive number of devices", c.Fleet.MaxForward))
	}
	if len(c.NATS) > 0 && c.NATSListen != "" {
		errs = append(errs, errors.New("--nats-listen applies to the embedded NATS server only; drop it when --nats is set"))
	}
	if err := c.Broker.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// AdminTokenPath is where the node keeps its admin token.
func (c *Config) AdminTokenPath() string { return filepath.Join(c.DataDir, "admin.token") }
