package agent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/config"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// Protocols an agent can speak to a relay.
const (
	ProtocolNative   = "native"   // Switchboard's tunnel: one multiplexed connection
	ProtocolLongPoll = "longpoll" // the http-relay long-poll protocol
)

// Defaults of Config, taken by Complete, the command line's flags and the
// docs alike.
const (
	DefaultProtocol           = ProtocolNative
	DefaultMaxChunkSize       = 1 << 20
	DefaultBlockSize          = 64 << 10
	DefaultNumPendingRequests = 1
	DefaultMaxRequestBytes    = 256 << 20
	DefaultKeepAlive          = 3 * time.Second
	DefaultPollTimeout        = 45 * time.Second
	DefaultTunnelVersion      = tunnel.V2
	// DefaultStandbyPingInterval and DefaultStandbyPingTimeout are the
	// native tunnel's pings for an agent that keeps a standby tunnel: the
	// fleet's watchdog, not the agent, notices a frozen relay then, and
	// the agent pings only to notice a relay it cannot reach itself, within
	// 35 s, and to keep the path's NAT and balancer mappings alive (the
	// long-poll protocol's agents re-poll every 30 s, which such paths
	// bear). An agent without one (--websocket, --tunnel-version 1,
	// NoStandby) pings as tunnel.Liveness's defaults say.
	DefaultStandbyPingInterval = 25 * time.Second
	DefaultStandbyPingTimeout  = 10 * time.Second
	// DefaultPromotionWait is Config.PromotionWait's default. A holder
	// that crashed closes every connection to it at once: the standby's
	// relay, whose probe connection to it closed too, finds it refusing
	// and promotes the standby within milliseconds (watchdog.ProbeSoon).
	// A holder that closed only this tunnel (a cancel) is alive and
	// promotes nothing, and the agent connects again after the wait.
	DefaultPromotionWait = 150 * time.Millisecond
	// DefaultStandbySpread is Config.StandbySpread's default: 10,000
	// agents named a standby at once dial it at about 2,000 a second.
	DefaultStandbySpread = 5 * time.Second
)

// Config configures an agent. Zero fields take the defaults named on them.
type Config struct {
	// Relays are the relay URLs to dial, e.g. https://relay.example.com.
	// The first one is used; the others are tried when it fails. Required.
	Relays []*url.URL
	// RelayPrefix is put before every agent path (/server/...), for an
	// ingress that routes by prefix and rewrites it away. Default none.
	RelayPrefix string
	// Device is the device name users address. Required.
	Device string
	// Backend is the local service, e.g. http://127.0.0.1:3000; a path in it
	// is put before every request's path. Required.
	Backend *url.URL
	// BackendH2C speaks HTTP/2 cleartext (prior knowledge) to the backend,
	// as gRPC servers want. Default off.
	BackendH2C bool
	// BackendRootCAs verifies an https:// backend's certificate; nil means
	// the system pool.
	BackendRootCAs *x509.CertPool
	// BroadcastPaths are paths of the device (as users see them, under
	// /client/<device>) whose GETs answer one stream for every viewer:
	// MJPEG, server-sent events, followed logs. The agent marks their
	// answers, and each relay then fetches such a stream once and shares
	// it among its viewers, each joining at the next part. Default none.
	BroadcastPaths []string
	// DisableHTTP2 keeps the backend connection on HTTP/1.1 even over TLS.
	DisableHTTP2 bool
	// PreserveHost sends the user's Host header to the backend instead of the
	// backend's own address. Default true in the command line.
	PreserveHost bool
	// Token is the agent's credential, sent as a bearer token. Default none
	// (for relays that allow anonymous agents).
	Token string
	// RootCAs verifies the relays' certificates (see tlsconf.LoadCAPool);
	// nil means the system pool.
	RootCAs *x509.CertPool
	// Protocol is the protocol to speak: ProtocolNative (the default), which
	// falls back to ProtocolLongPoll against a relay that lacks the tunnel,
	// or ProtocolLongPoll.
	Protocol string
	// WebSocket carries the native tunnel in a WebSocket, for paths that
	// pass nothing else. Default off: an HTTP/1.1 Upgrade.
	WebSocket bool
	// Liveness sets the native tunnel's pings; see tunnel.Liveness. Default
	// DefaultStandbyPingInterval and DefaultStandbyPingTimeout for an agent
	// that keeps a standby tunnel, else tunnel.Liveness's.
	Liveness tunnel.Liveness
	// Services are the agent's services besides the one Backend gives
	// (named service.Default), announced to a version 2 relay; the relay
	// may open streams to these and nothing else. Default none.
	Services []service.Service
	// Passthrough names services of Services, tcp:// ones that serve TLS
	// themselves, that anyone may reach through the relays' TLS listener
	// by SNI (SERVICE--DEVICE.ZONE) with no credential: the device's owner
	// says so here, and the service authenticates its users. Default
	// none: a service is reached only with a user token.
	Passthrough []string
	// TunnelVersion is the newest native tunnel version to offer:
	// tunnel.V2 (the default), which falls back to tunnel.V1 against a
	// relay that lacks it, or tunnel.V1 alone.
	TunnelVersion int
	// NoStandby keeps no standby tunnel beside the native tunnel. Default
	// off: a version 2 tunnel over an HTTP/1.1 Upgrade keeps one at the
	// relay its holder names (docs/design/hot-standby.md).
	NoStandby bool
	// PromotionWait is how long an agent whose tunnel closed waits for its
	// standby's relay to promote the standby before it connects again.
	// Default DefaultPromotionWait.
	PromotionWait time.Duration
	// StandbySpread bounds the random wait before the agent dials a
	// standby its holder named after it connected (a relay joined the
	// fleet, or the standby it kept went): the holder names one to all of
	// its devices' agents in one round, and the relay named is not dialled
	// by all of them in one moment. Default DefaultStandbySpread.
	StandbySpread time.Duration
	// MaxChunkSize caps the response bytes posted per chunk. Default 1 MiB.
	MaxChunkSize int
	// BlockSize is the read size from the backend. Default 64 KiB.
	BlockSize int
	// NumPendingRequests is the number of concurrent polls. Default 1.
	NumPendingRequests int
	// MaxRequestBytes caps one HttpRequest received from the relay. Default 256 MiB.
	MaxRequestBytes int
	// KeepAlive is the idle time after which an empty chunk tells the relay
	// that a response is still alive. Default 3 s.
	KeepAlive time.Duration
	// PollTimeout bounds one poll; it must exceed the relay's poll wait.
	// Default 45 s.
	PollTimeout time.Duration
	// Logger receives the agent's logs; nil discards them.
	Logger *slog.Logger
}

// Complete fills in defaults for zero fields.
func (c *Config) Complete() {
	if c.Protocol == "" {
		c.Protocol = DefaultProtocol
	}
	if c.keepsStandby() {
		if c.Liveness.Interval <= 0 {
			c.Liveness.Interval = DefaultStandbyPingInterval
		}
		if c.Liveness.Timeout <= 0 {
			c.Liveness.Timeout = DefaultStandbyPingTimeout
		}
	}
	c.Liveness = c.Liveness.WithDefaults()
	if c.PromotionWait <= 0 {
		c.PromotionWait = DefaultPromotionWait
	}
	if c.StandbySpread <= 0 {
		c.StandbySpread = DefaultStandbySpread
	}
	if c.MaxChunkSize <= 0 {
		c.MaxChunkSize = DefaultMaxChunkSize
	}
	if c.BlockSize <= 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.NumPendingRequests <= 0 {
		c.NumPendingRequests = DefaultNumPendingRequests
	}
	if c.MaxRequestBytes <= 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = DefaultKeepAlive
	}
	if c.PollTimeout <= 0 {
		c.PollTimeout = DefaultPollTimeout
	}
	if c.TunnelVersion == 0 {
		c.TunnelVersion = DefaultTunnelVersion
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RelayPrefix != "" {
		c.RelayPrefix = "/" + strings.Trim(c.RelayPrefix, "/")
	}
}

// Validate rejects settings that cannot work, saying how to fix them. Its
// errors are *config.FieldError, in the words of this Config's fields (the
// command line names its flags instead).
func (c *Config) Validate() error {
	var errs []error
	if len(c.Relays) == 0 {
		errs = append(errs, invalidf("Relays", "is empty: give a relay's URL, e.g. http://127.0.0.1:8080"))
	}
	for _, p := range c.BroadcastPaths {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?# ") {
			errs = append(errs, invalidf("BroadcastPaths", "%q must be a path starting with '/', without query or spaces, e.g. /stream.mjpeg", p))
		}
	}
	for _, u := range c.Relays {
		if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			errs = append(errs, invalidf("Relays", "URL %q must look like http(s)://host[:port]", u))
		}
	}
	if c.Device == "" {
		errs = append(errs, invalidf("Device", "is empty: give the device name users address"))
	}
	if c.Backend == nil {
		errs = append(errs, invalidf("Backend", "is empty: give the local service, e.g. http://127.0.0.1:3000"))
	} else if c.Backend.Scheme != "http" && c.Backend.Scheme != "https" || c.Backend.Host == "" {
		errs = append(errs, invalidf("Backend", "URL %q must look like http(s)://host[:port][/path]", c.Backend))
	}
	if c.BackendH2C && c.Backend != nil && c.Backend.Scheme != "http" {
		errs = append(errs, config.Invalid(component, "BackendH2C", func(name func(string) string) string {
			return "needs an http:// " + name("Backend") + " URL: h2c is HTTP/2 without TLS"
		}))
	}
	if err := checkServices(c); err != nil {
		errs = append(errs, err)
	}
	if c.Protocol != ProtocolLongPoll && c.Protocol != ProtocolNative {
		errs = append(errs, invalidf("Protocol", "%q is unknown: use %q or %q", c.Protocol, ProtocolNative, ProtocolLongPoll))
	}
	return errors.Join(errs...)
}

// component names the agent in its configuration errors.
const component = "agent"

func invalidf(field, format string, args ...any) error {
	return config.Invalidf(component, field, format, args...)
}

func (c *Config) tlsConfig() *tls.Config {
	return &tls.Config{RootCAs: c.RootCAs, MinVersion: tls.VersionTLS12}
}

// keepsStandby reports whether the agent keeps a standby tunnel beside its
// native tunnel when its relay names one.
func (c *Config) keepsStandby() bool {
	return c.Protocol == ProtocolNative && c.tunnelVersion() == tunnel.V2 && !c.WebSocket && !c.NoStandby
}
