package cli

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/config"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// TestConfigErrorsNameFlags gives each validated field a bad value through
// its flag and checks that the user reads the flag's name, while the error
// still carries the component's config.FieldError. Every entry of flagOf
// must be reached.
func TestConfigErrorsNameFlags(t *testing.T) {
	tests := []struct {
		cmd  string // serve (node and broker), fleet, store or agent
		args []string
		want string
	}{
		{"serve", []string{"--listen", "nope"}, `--listen "nope" is not host:port`},
		{"serve", []string{"--admin-listen", "nope"}, `--admin-listen "nope" is not host:port`},
		{"serve", []string{"--advertise", "ftp://x"}, `--advertise "ftp://x" is not an http:// or https:// URL`},
		{"serve", []string{"--tls-cert", "c.pem"}, "--tls-cert is set but --tls-key is not"},
		{"serve", []string{"--tls-key", "k.pem"}, "--tls-key is set but --tls-cert is not"},
		{"serve", []string{"--admin-tls-cert", "c.pem"}, "--admin-tls-cert is set but --admin-tls-key is not"},
		{"serve", []string{"--admin-tls-key", "k.pem"}, "--admin-tls-key is set but --admin-tls-cert is not"},
		{"serve", []string{"--advertise", "http://x", "--tls-cert", "c.pem", "--tls-key", "k.pem"}, `--advertise "http://x" is plain http:// but the public listener serves TLS (--tls-cert)`},
		{"serve", []string{"--sni-zone", "tls.example.com"}, "--sni-zone needs the public listener to serve TLS: give --tls-cert and --tls-key"},
		{"serve", []string{"--sni-zone", "bad_zone.example", "--tls-cert", "c.pem", "--tls-key", "k.pem"}, `--sni-zone "bad_zone.example" has the label "bad_zone"`},
		{"serve", []string{"--max-forward", "-1"}, "--max-forward -1: give a positive number of devices"},
		{"serve", []string{"--max-streams-per-agent", "-1"}, "--max-streams-per-agent -1: give a positive number of requests (default 256)"},
		{"serve", []string{"--nats", "nats://x:4222", "--nats-listen", ":4333"}, "--nats-listen applies to the embedded NATS server only; drop it when --nats is set"},
		{"serve", []string{"--no-agent-grace", "-1s"}, "--no-agent-grace must be positive"},
		{"serve", []string{"--pickup-timeout", "-1s"}, "--pickup-timeout must be positive"},
		{"serve", []string{"--inactive_request_timeout", "-1s"}, "--inactive_request_timeout must be positive"},
		{"serve", []string{"--inactive_backend_timeout", "-1s"}, "--inactive_backend_timeout must be positive"},
		{"serve", []string{"--max-pending-per-device", "-1"}, "--max-pending-per-device must be positive"},
		{"serve", []string{"--max-request-body", "-1"}, "--max-request-body must be positive"},
		{"serve", []string{"--block_size", "-1"}, "--block_size must be positive"},
		{"serve", []string{"--pickup-timeout", "2m"}, "--pickup-timeout (2m0s) must not exceed --inactive_request_timeout (1m0s)"},

		{"fleet", []string{"--fresh-after", "1s"}, "--fresh-after 1s is shorter than --heartbeat-interval 2s"},
		{"fleet", []string{"--lost-window", "1s"}, "--lost-window 1s is shorter than --fresh-after 6s"},

		{"store", []string{"--nats-listen", "0.0.0.0:4333"}, "--nats-listen 0.0.0.0:4333 would let the embedded NATS server accept connections from other machines without credentials"},
		{"store", []string{"--nats-listen", "0.0.0.0:4333"}, "(--nats-user with --nats-password-file, --nats-token-file or --nats-nkey-file) or listen on loopback only (--nats-listen :4333 or 127.0.0.1:4333)"},
		{"store", []string{"--nats-listen", "nope"}, `--nats-listen "nope" is not host:port`},
		{"store", []string{"--nats", "ftp://x"}, `--nats "ftp://x" has scheme "ftp"`},
		{"store", []string{"--nats", "nats://x:4222", "--nats-replicas", "7"}, "--nats-replicas is 7; JetStream keeps 1 to 5 copies"},
		{"store", []string{"--nats-ca-file", "ca.pem"}, "--nats-ca-file (ca.pem) is for tls:// URLs"},
		{"store", []string{"--nats-user", "u", "--nats-token-file", "t"}, "store: Credentials are of several kinds (user/password, token); give one: --nats-user with --nats-password-file, --nats-token-file, --nats-nkey-file or --nats-creds"},
		{"store", []string{"--nats-user", "u"}, `--nats-user "u" has no password; give --nats-password-file`},
		{"store", []string{"--nats-password-file", "pw"}, "--nats-user is empty, but a NATS password is given, which needs its user: add --nats-user"},
		{"store", []string{"--nats-creds", "r.creds"}, "--nats-creds (r.creds) needs a NATS server in operator mode, which the embedded server is not; use it with --nats"},
		{"store", []string{"--nats", "nats://u:p@x:4222", "--nats-token-file", "t"}, "carries credentials, and token credentials are given too"},

		{"agent", []string{"--device", "d", "--backend", "http://b"}, "--relay is empty: give a relay's URL"},
		{"agent", []string{"--relay", "ftp://x", "--device", "d", "--backend", "http://b"}, `--relay URL "ftp://x" must look like http(s)://host[:port]`},
		{"agent", []string{"--relay", "http://r", "--backend", "http://b"}, "--device is empty"},
		{"agent", []string{"--relay", "http://r", "--device", "d", "--backend", "http://b", "--broadcast-path", "stream"}, `--broadcast-path "stream" must be a path starting with '/'`},
		{"agent", []string{"--relay", "http://r", "--device", "d", "--backend", "http://b", "--tunnel-version", "3"}, "--tunnel-version 3 is no tunnel version: use 1 or 2"},
		{"agent", []string{"--relay", "http://r", "--device", "d"}, "--backend is empty"},
		{"agent", []string{"--relay", "http://r", "--device", "d", "--backend", "http://b", "--service", "db=tls://db:5432", "--tls-passthrough", "db"}, `--tls-passthrough names "db", which is not a tcp:// service`},
		{"agent", []string{"--relay", "http://r", "--device", "d", "--backend", "ftp://b"}, `--backend URL "ftp://b" must look like`},
		{"agent", []string{"--relay", "http://r", "--device", "d", "--backend", "https://b", "--backend-h2c"}, "--backend-h2c needs an http:// --backend URL"},
		{"agent", []string{"--relay", "http://r", "--device", "d", "--backend", "http://b", "--protocol", "x"}, `--protocol "x" is unknown`},
	}
	reached := map[string]bool{}
	for _, tt := range tests {
		t.Run(strings.Join(append([]string{tt.cmd}, tt.args...), " "), func(t *testing.T) {
			err := validateArgs(t, tt.cmd, tt.args)
			fields := config.Fields(err)
			if len(fields) == 0 {
				t.Fatalf("error %v carries no config.FieldError", err)
			}
			for _, fe := range fields {
				reached[fe.Component+"."+fe.Field] = true
			}
			told := withFlagNames(err)
			if !strings.Contains(told.Error(), tt.want) {
				t.Errorf("the user reads\n%v\nwant it to say %q", told, tt.want)
			}
			if fe := new(config.FieldError); !errors.As(told, &fe) {
				t.Errorf("the renamed error no longer matches *config.FieldError")
			}
		})
	}
	// Fields named only inside another field's message.
	named := map[string]bool{"node.NATS": true, "fleet.BeatInterval": true,
		"store.Credentials.PasswordFile": true, "store.Credentials.TokenFile": true, "store.Credentials.NkeySeedFile": true}
	for key := range flagOf {
		if !reached[key] && !named[key] {
			t.Errorf("flagOf[%q]: no test gives that field a bad value", key)
		}
	}
	serve, agentFS := commandFlags()
	for key, name := range flagOf {
		if lookup([]*flag.FlagSet{serve, agentFS}, strings.TrimPrefix(name, "--")) == nil {
			t.Errorf("flagOf[%q] = %s, which no command has", key, name)
		}
	}
}

// validateArgs parses args as cmd's flags and validates the Config they
// fill, as the command (or, for fleet and store, the node it starts) does.
func validateArgs(t *testing.T, cmd string, args []string) error {
	t.Helper()
	if cmd == "agent" {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		var f agentFlags
		f.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.config()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Complete()
		return cfg.Validate()
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg node.Config
	var logf logFlags
	_, nats := serveFlags(fs, &cfg, &logf)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	cfg.NATS = splitList(*nats)
	cfg.Complete()
	switch cmd {
	case "fleet":
		fc := cfg.Fleet
		fc.RelayID = "rl-0123abcd"
		fc.Complete()
		return fc.Validate()
	case "store":
		sc := store.Config{DataDir: cfg.DataDir, URLs: cfg.NATS, Listen: cfg.NATSListen, Credentials: cfg.NATSCredentials, CAFile: cfg.NATSCAFile, Replicas: cfg.NATSReplicas}
		sc.Complete()
		return sc.Validate()
	}
	return cfg.Validate()
}

var _ fleet.Local = nil // fleet's Validate also asks for a Local, which no flag fills
