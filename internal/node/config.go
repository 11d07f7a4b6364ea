package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/config"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/fleetsecret"
	"github.com/switchboard-relay/switchboard/internal/limit"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/topic"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
	"github.com/switchboard-relay/switchboard/internal/watchdog"
)

// Defaults of Config, taken by Complete, the command line's flags and the
// docs alike. The defaults of the components a node is made of are theirs:
// broker.Default…, fleet.Default…, watchdog.Default…, tunnel.Default….
const (
	DefaultListen             = ":8080"
	DefaultAdminListen        = "127.0.0.1:9090"
	DefaultDataDir            = store.DefaultDataDir
	DefaultNATSReplicas       = store.DefaultReplicas
	DefaultMaxChunkBytes      = 16 << 20
	DefaultMaxHeaderBytes     = 64 << 10
	DefaultReadHeaderTimeout  = 10 * time.Second
	DefaultIdleTimeout        = 120 * time.Second
	DefaultIdleStreamTimeout  = 60 * time.Second
	DefaultMaxStreamsPerAgent = tunnel.DefaultMaxStreams
	DefaultDrainTimeout       = 25 * time.Second
	DefaultShutdownDelay      = time.Second
	DefaultDrainSpread        = 5 * time.Second
	DefaultSessionTTL         = 8 * time.Hour
	// AdminTokenFileName is the admin token's file in DataDir, unless
	// AdminTokenFile names another.
	AdminTokenFileName = "admin.token"
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
	// RelayName, if set, is a name that stays with this relay across
	// restarts (a StatefulSet pod's name, a host name): the relay id is
	// derived from it instead of minted into DataDir, so that a relay whose
	// data directory is not kept comes back as itself. Empty by default.
	RelayName string
	// AdminTokenFile is where the admin token is read from, or written to
	// on first start. Default DataDir/admin.token.
	AdminTokenFile string
	// NATS are external NATS URLs; empty starts an embedded NATS server.
	NATS []string
	// NATSListen is where the embedded NATS server also accepts other
	// relays; empty keeps it in-process only, ":port" binds loopback only.
	// See store.Config.Listen.
	NATSListen string
	// NATSCredentials are presented to NATS and, by the embedded server,
	// demanded of every client. None by default; see store.Credentials.
	NATSCredentials store.Credentials
	// NATSCAFile names the CA certificates (PEM) that verify tls:// NATS
	// servers. Empty, the default, trusts the system's roots.
	NATSCAFile string
	// NATSReplicas is how many copies an external NATS cluster keeps of
	// each bucket and stream: 3 on a three-node cluster. Default 1, the
	// only value the embedded server takes.
	NATSReplicas int
	// Advertise is the URL other relays and agents use to reach this relay;
	// empty derives it from the public listener (https:// when it serves
	// TLS).
	Advertise string
	// TLSCertFile and TLSKeyFile are the PEM certificate (with its chain)
	// and key the public listener serves TLS with; give both or neither.
	// Replaced files are picked up by new connections without a restart.
	// With TLS the listener speaks HTTP/1.1 and HTTP/2 by ALPN. Default
	// none: plain HTTP/1.1 and h2c.
	TLSCertFile string
	TLSKeyFile  string
	// AdminTLSCertFile and AdminTLSKeyFile are the same for the admin
	// listener; its sign-in cookie is then Secure. Default none: plain HTTP.
	AdminTLSCertFile string
	AdminTLSKeyFile  string
	// SNIZone, when set, turns on TLS passthrough on the public TLS
	// listener: a connection whose ClientHello names
	// SERVICE--DEVICE.<SNIZone> is not terminated but passed whole to the
	// device's service, which its agent offers for passthrough
	// (--tls-passthrough), here or one hop to the relay holding the device.
	// Every other name is served by this relay as before. Needs
	// TLSCertFile. Default none: no passthrough.
	SNIZone string
	// PeerCAFile is a PEM bundle of the CAs that sign the other relays'
	// certificates. Forwards and watchdog probes to a relay advertised at an
	// https:// URL verify it against these CAs only (the system roots are
	// then not trusted for peers). Default none: the system roots.
	PeerCAFile string
	// Region labels the relay for the ranking (same region first).
	Region string
	// KeepArrivingAgents makes this relay take every native agent that
	// reaches it and hold every long-poll agent's poll itself, instead of
	// sending them to the relay the ranking picks, and gives agents no list
	// of relays, so that they always come back through the address they
	// were configured with. It is for fleets behind a front door that
	// hashes on the device (see docs/design/routing.md): the relay the
	// front door sends a device's agents to keeps the device, and users'
	// requests, hashed to the same relay, need no forward hop. A relay that
	// drains or stops still turns agents away. Off by default: behind a
	// round-robin balancer it would scatter devices over the relays.
	KeepArrivingAgents bool
	// Watchdog sets how this relay probes its peers and how long a veto
	// lasts; see watchdog.Config (Peers and Probe are filled in).
	Watchdog watchdog.Config
	// Fleet holds the heartbeat, freshness, lease and reaping settings; the
	// node fills in the relay's identity. See fleet.Config.
	Fleet fleet.Config
	// FleetSecret says where the fleet secret comes from: the fleet's
	// stored one by default, or a file. The node fills in the relay's id
	// and the beat interval. See fleetsecret.Config.
	FleetSecret fleetsecret.Config
	// AllowAnonymousUsers lets users in without a token. Default off.
	AllowAnonymousUsers bool
	// AllowAnonymousAgents lets agents serve any device without a token.
	// Default off.
	AllowAnonymousAgents bool
	// Broker holds the long-poll timeouts and limits; see broker.Config.
	Broker broker.Config
	// Topics sets the broadcast topics' per-reader queues, lag limit,
	// message size and backlog; see topic.Config for the defaults (Link
	// and Logger are filled in).
	Topics topic.Config
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
	// IdleStreamTimeout cuts a request on either listener when no byte has
	// moved in either direction for this long while the relay waits on the
	// client: a body trickled or stalled (408 when the response has not
	// begun), a response not read (the stream or connection is cut, and the
	// device's request cancelled). Waiting for the device does not count,
	// so quiet log follows and gRPC streams live on. Websockets after their
	// 101 are not covered. It is also the listeners' HTTP/2 write-byte
	// timeout: an HTTP/2 client that reads nothing at all stalls its whole
	// connection, which is then closed. Default 60 s; negative turns it off.
	IdleStreamTimeout time.Duration
	// MaxStreamsPerAgent caps the requests one native agent is sent at
	// once (fewer when the agent advertises fewer; Switchboard's agents
	// advertise 256). When every agent of a device is at its cap, users get
	// 503 with Retry-After at once instead of a queue. Default 256.
	MaxStreamsPerAgent int
	// MaxStreamsPerDevice caps the requests one device's version 2 agents
	// are sent at once, all together (version 2 has no cap per agent);
	// beyond it users get 503 with Retry-After at once. Default 10,000.
	MaxStreamsPerDevice int
	// TunnelV1Only makes the relay take only version 1 tunnels, as a relay
	// from before version 2 did: for tests of mixed fleets. Default off.
	TunnelV1Only bool
	// NoStreamForward makes the relay neither take nor send forwards as
	// streams (package forward), as a relay from before them: every
	// forward goes over HTTP. For tests of mixed fleets. Default off.
	NoStreamForward bool
	// HotStandby makes the relay keep standby tunnels for devices held by
	// other relays and name, to each agent it takes, the relay to keep one
	// at (docs/failover.md, "Hot standby"). Default off: at 10,000 agents
	// a relay, the standbys' dials and directory writes overload a fleet
	// whose relays share their cores with NATS (docs/benchmarks.md), so
	// that it is for fleets that measured it.
	HotStandby bool
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
	// AuthBackoff is the back-off of client addresses that keep presenting
	// invalid credentials (tokens, codes, sessions); see limit.Config for
	// its defaults. Each listener keeps its own count with this policy, so
	// that failures on the public listener never refuse the operator on
	// the admin listener; there a valid admin token is never refused.
	AuthBackoff limit.Config
	// SessionTTL is how long the browser session an access code opens
	// lasts (revoking the token ends it sooner). Default 8 h.
	SessionTTL time.Duration
	// Version is reported in metrics and logs.
	Version string
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
}

// Complete fills in defaults for zero fields.
func (c *Config) Complete() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.NATSReplicas == 0 {
		c.NATSReplicas = DefaultNATSReplicas
	}
	if c.MaxChunkBytes <= 0 {
		c.MaxChunkBytes = DefaultMaxChunkBytes
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.IdleStreamTimeout == 0 {
		c.IdleStreamTimeout = DefaultIdleStreamTimeout
	}
	if c.MaxStreamsPerAgent == 0 {
		c.MaxStreamsPerAgent = DefaultMaxStreamsPerAgent
	}
	if c.MaxStreamsPerDevice == 0 {
		c.MaxStreamsPerDevice = tunnel.DefaultMaxDeviceStreams
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.ShutdownDelay <= 0 {
		c.ShutdownDelay = DefaultShutdownDelay
	}
	if c.DrainSpread <= 0 {
		c.DrainSpread = DefaultDrainSpread
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Broker.Complete()
	c.Topics.Complete()
}

// Validate rejects settings that cannot work, saying how to fix them. Its
// errors are *config.FieldError, in the words of this Config's fields (the
// command line names its flags instead), joined with the broker's.
func (c *Config) Validate() error {
	var errs []error
	for _, l := range []struct{ field, addr string }{{"Listen", c.Listen}, {"AdminListen", c.AdminListen}} {
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			errs = append(errs, invalidf(l.field, "%q is not host:port (e.g. :8080 or 127.0.0.1:9090)", l.addr))
		}
	}
	if c.Advertise != "" {
		if u, err := url.Parse(c.Advertise); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, invalidf("Advertise", "%q is not an http:// or https:// URL with a host (e.g. https://relay-1.example.com)", c.Advertise))
		}
	}
	errs = append(errs, pairError("TLSCertFile", c.TLSCertFile, "TLSKeyFile", c.TLSKeyFile),
		pairError("AdminTLSCertFile", c.AdminTLSCertFile, "AdminTLSKeyFile", c.AdminTLSKeyFile))
	if c.Advertise != "" && c.TLSCertFile != "" && strings.HasPrefix(c.Advertise, "http://") {
		errs = append(errs, config.Invalid(component, "Advertise", func(name func(string) string) string {
			return fmt.Sprintf("%q is plain http:// but the public listener serves TLS (%s): advertise an https:// URL", c.Advertise, name("TLSCertFile"))
		}))
	}
	if c.SNIZone != "" {
		if err := checkZone(c.SNIZone); err != nil {
			errs = append(errs, invalidf("SNIZone", "%q %v (e.g. tls.example.com: names are then SERVICE--DEVICE.tls.example.com)", c.SNIZone, err))
		} else if c.TLSCertFile == "" {
			errs = append(errs, config.Invalid(component, "SNIZone", func(name func(string) string) string {
				return "needs the public listener to serve TLS: give " + name("TLSCertFile") + " and " + name("TLSKeyFile") + " (the certificate is for the relay's own names; passthrough never uses it)"
			}))
		}
	}
	if c.Fleet.MaxForward < 0 {
		errs = append(errs, invalidf("Fleet.MaxForward", "%d: give a positive number of devices", c.Fleet.MaxForward))
	}
	if c.MaxStreamsPerAgent < 0 {
		errs = append(errs, invalidf("MaxStreamsPerAgent", "%d: give a positive number of requests (default %d)", c.MaxStreamsPerAgent, DefaultMaxStreamsPerAgent))
	}
	if c.MaxStreamsPerDevice < 0 {
		errs = append(errs, fmt.Errorf("--max-streams-per-device %d: give a positive number of requests (default %d)", c.MaxStreamsPerDevice, tunnel.DefaultMaxDeviceStreams))
	}
	if len(c.NATS) > 0 && c.NATSListen != "" {
		errs = append(errs, config.Invalid(component, "NATSListen", func(name func(string) string) string {
			return "applies to the embedded NATS server only; drop it when " + name("NATS") + " is set"
		}))
	}
	if err := c.Broker.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// component names the node in its configuration errors.
const component = "node"

func invalidf(field, format string, args ...any) error {
	return config.Invalidf(component, field, format, args...)
}

// pairError says what is missing when only one of a certificate file and
// its key file is given.
func pairError(certField, cert, keyField, key string) error {
	switch {
	case cert != "" && key == "":
		return config.Invalid(component, certField, func(name func(string) string) string {
			return "is set but " + name(keyField) + " is not: give the certificate's key file too"
		})
	case cert == "" && key != "":
		return config.Invalid(component, keyField, func(name func(string) string) string {
			return "is set but " + name(certField) + " is not: give the certificate file too"
		})
	}
	return nil
}

// checkZone reports whether zone is a DNS name of two labels or more.
func checkZone(zone string) error {
	labels := strings.Split(strings.TrimSuffix(zone, "."), ".")
	if len(labels) < 2 || len(zone) > 253 {
		return errors.New("is not a DNS name of two labels or more")
	}
	for _, l := range labels {
		bad := l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-'
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				bad = true
			}
		}
		if bad {
			return fmt.Errorf("has the label %q, not one of letters, digits and hyphens", l)
		}
	}
	return nil
}

// AdminTokenPath is where the node keeps its admin token.
func (c *Config) AdminTokenPath() string {
	if c.AdminTokenFile != "" {
		return c.AdminTokenFile
	}
	return filepath.Join(c.DataDir, AdminTokenFileName)
}
