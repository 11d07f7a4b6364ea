package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/config"
)

// Defaults of Config, taken by Complete, the command line's flags and the
// docs alike.
const (
	DefaultPollWait               = 30 * time.Second
	DefaultNoAgentGrace           = 2 * time.Second
	DefaultPickupTimeout          = 10 * time.Second
	DefaultInactiveRequestTimeout = 60 * time.Second
	DefaultInactiveBackendTimeout = 30 * time.Minute
	DefaultRequestStreamWait      = 30 * time.Second
	DefaultAgentGoneGrace         = time.Second
	DefaultMaxPendingPerDevice    = 64
	DefaultMaxBodyBytes           = 64 << 20
	DefaultBlockSize              = 10240
)

// Config sets the broker's timeouts and limits. The zero value of every field
// means its default, filled in by Complete.
type Config struct {
	// PollWait is how long an agent's poll waits for a user request before it is
	// answered 408 and the agent polls again. Default 30 s, as the reference relay.
	PollWait time.Duration
	// NoAgentGrace is how long a request for a device whose agent is not
	// connected right now waits for one to connect before the user gets 503.
	// Default 2 s: long enough to ride out an agent's reconnect, short enough
	// that nobody stares at a hanging browser.
	NoAgentGrace time.Duration
	// PickupTimeout is how long a request waits for a connected but busy agent
	// to take it. Default 10 s.
	PickupTimeout time.Duration
	// InactiveRequestTimeout bounds the wait for the agent's first response
	// chunk and for every later chunk; the user gets 504 when it passes.
	// Default 60 s, as the reference relay's --inactive_request_timeout.
	InactiveRequestTimeout time.Duration
	// InactiveBackendTimeout is how long a device is remembered after its
	// agent's last poll. A forgotten device answers 503 at once. Default 30 min,
	// as the reference relay's --inactive_backend_timeout.
	InactiveBackendTimeout time.Duration
	// RequestStreamWait is how long an agent's /server/requeststream call waits
	// for user bytes before it is answered with an empty body. Default 30 s.
	RequestStreamWait time.Duration
	// AgentGoneGrace is how long an agent process that identifies itself
	// (agent.InstanceHeader) may be without a poll after its last poll's
	// connection dropped before its requests in flight fail. Default 1 s.
	AgentGoneGrace time.Duration
	// MaxPendingPerDevice caps the user requests waiting for a device's agent;
	// beyond it users get 503 with Retry-After. Default 64.
	MaxPendingPerDevice int
	// MaxBodyBytes caps a user request body, which the long-poll protocol
	// carries whole; beyond it users get 413. Default 64 MiB.
	MaxBodyBytes int64
	// BlockSize caps the user bytes handed to an agent per requeststream call
	// after a 101 upgrade. Default 10240, as the reference relay's --block_size.
	BlockSize int
	// Metrics is where the broker registers its metrics; nil registers nowhere.
	Metrics prometheus.Registerer
	// Logger receives the broker's logs; nil discards them.
	Logger *slog.Logger
	// IDPrefix, 8 lowercase hex digits or empty, starts the hex part of
	// every request id this broker makes: the relay's id, so that any relay
	// of the fleet can send an agent's answer to the relay that holds the
	// request.
	IDPrefix string
	// OnAttach, if set, is called when a device gains a long-poll agent it
	// did not have (a new agent instance, or the first poll after a quiet
	// spell). It must not block.
	OnAttach func(device string)
}

// Complete fills in defaults for zero fields.
func (c *Config) Complete() {
	setDefault(&c.PollWait, DefaultPollWait)
	setDefault(&c.NoAgentGrace, DefaultNoAgentGrace)
	setDefault(&c.PickupTimeout, DefaultPickupTimeout)
	setDefault(&c.InactiveRequestTimeout, DefaultInactiveRequestTimeout)
	setDefault(&c.InactiveBackendTimeout, DefaultInactiveBackendTimeout)
	setDefault(&c.RequestStreamWait, DefaultRequestStreamWait)
	setDefault(&c.AgentGoneGrace, DefaultAgentGoneGrace)
	setDefault(&c.MaxPendingPerDevice, DefaultMaxPendingPerDevice)
	setDefault(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.BlockSize, DefaultBlockSize)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate rejects settings that cannot work. Its errors are
// *config.FieldError, in the words of this Config's fields.
func (c *Config) Validate() error {
	if len(c.IDPrefix) != 0 && len(c.IDPrefix) != 8 || strings.Trim(c.IDPrefix, "0123456789abcdef") != "" {
		return config.Invalidf(component, "IDPrefix", "%q must be 8 lowercase hex digits or empty", c.IDPrefix)
	}
	var errs []error
	positive := func(field string, ok bool) {
		if !ok {
			errs = append(errs, config.Invalidf(component, field, "must be positive"))
		}
	}
	positive("PollWait", c.PollWait > 0)
	positive("NoAgentGrace", c.NoAgentGrace > 0)
	positive("PickupTimeout", c.PickupTimeout > 0)
	positive("InactiveRequestTimeout", c.InactiveRequestTimeout > 0)
	positive("InactiveBackendTimeout", c.InactiveBackendTimeout > 0)
	positive("RequestStreamWait", c.RequestStreamWait > 0)
	positive("AgentGoneGrace", c.AgentGoneGrace > 0)
	positive("MaxPendingPerDevice", c.MaxPendingPerDevice > 0)
	positive("MaxBodyBytes", c.MaxBodyBytes > 0)
	positive("BlockSize", c.BlockSize > 0)
	if c.InactiveRequestTimeout > 0 && c.PickupTimeout > c.InactiveRequestTimeout {
		errs = append(errs, config.Invalid(component, "PickupTimeout", func(name func(string) string) string {
			return fmt.Sprintf("(%v) must not exceed %s (%v)", c.PickupTimeout, name("InactiveRequestTimeout"), c.InactiveRequestTimeout)
		}))
	}
	return errors.Join(errs...)
}

// component names the broker in its configuration errors.
const component = "broker"

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
