// Package store owns the connection to NATS JetStream, where the fleet's
// shared state lives. For a fleet of one it starts an embedded NATS server
// whose files sit in the node's data directory; for a larger fleet it connects
// to an external NATS cluster. Either way the rest of the relay sees the same
// thing: a JetStream context and key-value buckets.
package store

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/config"
)

// Defaults of Config.
const (
	// DefaultDataDir is the data directory used when Config.DataDir is empty.
	DefaultDataDir = "./switchboard-data"
	// DefaultReplicas is the copies JetStream keeps of each bucket when
	// Config.Replicas is 0: the only value the embedded server takes.
	DefaultReplicas = 1
)

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("invalid store configuration")

// Config says where the fleet state lives. The zero value, once completed,
// starts an embedded, in-process NATS server under ./switchboard-data/nats.
type Config struct {
	// DataDir is the node's data directory. The embedded NATS server keeps its
	// JetStream files under <DataDir>/nats. Defaults to ./switchboard-data.
	// Unused when URLs are set.
	DataDir string

	// URLs are the external NATS servers to connect to (nats://host:port,
	// tls://…). Empty, the default, starts an embedded server instead. Open
	// fails if none of them answers; once connected, the store reconnects
	// forever.
	URLs []string

	// Listen is the host:port where the embedded server also accepts other
	// relays; port 0 picks a free port (see ClientURL). Empty, the default,
	// keeps the server in-process only: no TCP port is opened at all. A
	// host left out (":4333") binds 127.0.0.1, loopback only; the server
	// listens beyond this machine only on an address named explicitly
	// ("0.0.0.0:4333", "10.0.0.5:4333", "[::]:4333"), and then only with
	// Credentials. It must be empty when URLs are set.
	Listen string

	// Credentials are presented to NATS and, by the embedded server,
	// demanded of every client. None by default; see Credentials.
	Credentials Credentials

	// CAFile names a PEM file of the certificate authorities that sign the
	// external NATS servers' certificates, for tls:// URLs the system's
	// roots cannot verify. Given, it makes the connection require TLS
	// whatever the URLs' scheme. Empty, the default, trusts the system's
	// roots. External NATS only.
	CAFile string

	// ServerName names the embedded NATS server. Defaults to
	// "switchboard-<hostname>".
	ServerName string

	// Replicas is how many copies JetStream keeps of each bucket. Defaults to
	// 1, the only possible value for the embedded server; use 3 on a
	// three-node NATS cluster. At most 5.
	Replicas int

	// Logger receives connection transitions and the embedded server's
	// warnings and errors. Defaults to a logger that discards everything.
	Logger *slog.Logger
}

// Complete fills in the defaults documented on each field.
func (c *Config) Complete() {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	c.URLs = cleanURLs(c.URLs)
	if c.ServerName == "" {
		c.ServerName = defaultServerName()
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate rejects a configuration that cannot work, saying how to fix it.
// It expects a completed Config.
func (c *Config) Validate() error {
	if len(c.URLs) > 0 && c.Listen != "" {
		return invalid("Listen", func(name func(string) string) string {
			return fmt.Sprintf("%q is for the embedded NATS server, but %s name external NATS servers; set one or the other", c.Listen, name("URLs"))
		})
	}
	for _, u := range c.URLs {
		if err := validateURL(u); err != nil {
			return err
		}
	}
	if c.Listen != "" {
		host, _, err := splitListen(c.Listen)
		if err != nil {
			return err
		}
		if !isLoopbackHost(host) && c.Credentials.Kind() == authNone {
			return invalid("Listen", func(name func(string) string) string {
				return fmt.Sprintf("%s would let the embedded NATS server accept connections from other machines without credentials, and anyone reaching it could read and change the fleet state; "+
					"give credentials (%s with %s, %s or %s) or listen on loopback only (%s :%s or 127.0.0.1:%[7]s)",
					c.Listen, name("Credentials.User"), name("Credentials.PasswordFile"), name("Credentials.TokenFile"), name("Credentials.NkeySeedFile"), name("Listen"), portOf(c.Listen))
			})
		}
	}
	if err := c.validateSecurity(); err != nil {
		return err
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return fieldf("Replicas", "is %d; JetStream keeps 1 to 5 copies (1 for the embedded server, 3 for a three-node cluster)", c.Replicas)
	}
	if len(c.URLs) == 0 && c.Replicas != 1 {
		return fieldf("Replicas", "is %d, but the embedded NATS server is a single node and can keep only 1 copy", c.Replicas)
	}
	if strings.ContainsAny(c.ServerName, " \t\r\n") {
		return fieldf("ServerName", "%q contains white space; use letters, digits and dashes", c.ServerName)
	}
	return nil
}

// validateSecurity checks the credentials and the CA file against the mode.
func (c *Config) validateSecurity() error {
	embedded := len(c.URLs) == 0
	if err := c.Credentials.validate(embedded); err != nil {
		return err
	}
	if embedded && c.CAFile != "" {
		return fieldf("CAFile", "(%s) is for tls:// URLs of external NATS servers; the embedded server does not use TLS", c.CAFile)
	}
	if c.Credentials.Kind() == authNone {
		return nil
	}
	for _, u := range c.URLs {
		if urlHasUserinfo(u) {
			return fieldf("URLs", "%s carries credentials, and %s credentials are given too; give them once, preferably from a file", redactURL(u), c.Credentials.Kind())
		}
	}
	return nil
}

func portOf(listen string) string {
	_, port, _ := net.SplitHostPort(listen)
	return port
}

// invalidf is an error of the configuration that no one field holds (a
// file it names cannot be read, say).
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// component names the store in its configuration errors.
const component = "store"

// fieldf is the error of one field, in the Config's words.
func fieldf(field, format string, args ...any) error {
	e := config.Invalidf(component, field, format, args...)
	e.Err = ErrInvalidConfig
	return e
}

// invalid is fieldf for a problem that names other fields.
func invalid(field string, problem func(name func(field string) string) string) error {
	e := config.Invalid(component, field, problem)
	e.Err = ErrInvalidConfig
	return e
}

// cleanURLs trims each URL and drops empty ones, so that "a, b," works.
func cleanURLs(urls []string) []string {
	var out []string
	for _, u := range urls {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

func validateURL(raw string) error {
	if !strings.Contains(raw, "://") {
		raw = "nats://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fieldf("URLs", "%q is not a URL; write it as nats://host:4222", redactURL(raw))
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
		return nil
	default:
		return fieldf("URLs", "%q has scheme %q; use nats://, tls://, ws:// or wss://", redactURL(raw), u.Scheme)
	}
}

// splitListen parses a host:port for the embedded server's client listener.
func splitListen(listen string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fieldf("Listen", "%q is not host:port (e.g. 127.0.0.1:4333 or :4333)", listen)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fieldf("Listen", "%q has port %q; use a number from 0 to 65535", listen, p)
	}
	return host, port, nil
}

func defaultServerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "switchboard"
	}
	return "switchboard-" + strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' {
			return '-'
		}
		return r
	}, host)
}
