package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/topic"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
	"github.com/switchboard-relay/switchboard/internal/watchdog"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// serveFlags binds the flags of 'switchboard serve' to a node.Config.
func serveFlags(fs *flag.FlagSet, cfg *node.Config, logf *logFlags) (port *int, nats *string) {
	fs.StringVar(&cfg.Listen, "listen", node.DefaultListen, "public `address` for users and agents (HTTP/1.1 and h2c; with --tls-cert HTTPS)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", node.DefaultAdminListen, "`address` of the operator API, admin page, /metrics, /healthz and /readyz")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate `file` (with its chain): the public listener serves HTTPS (HTTP/1.1 and HTTP/2); reloaded when replaced")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.StringVar(&cfg.SNIZone, "sni-zone", "", "DNS `zone` (e.g. tls.example.com) under which the public TLS listener passes connections for SERVICE--DEVICE.ZONE through to the device's service undecrypted, for services their agent offers with --tls-passthrough; needs --tls-cert; empty = no passthrough")
	fs.StringVar(&cfg.AdminTLSCertFile, "admin-tls-cert", "", "PEM certificate `file`: the admin listener serves HTTPS; reloaded when replaced")
	fs.StringVar(&cfg.AdminTLSKeyFile, "admin-tls-key", "", "PEM private key `file` of --admin-tls-cert")
	fs.StringVar(&cfg.PeerCAFile, "peer-ca-file", "", "PEM `file` of the CAs that sign the other relays' certificates (https:// peers); empty = the system roots")
	fs.StringVar(&cfg.DataDir, "data", node.DefaultDataDir, "data `dir`: embedded NATS store and admin token")
	fs.StringVar(&cfg.RelayName, "relay-name", "", "a `name` that stays with this relay across restarts (e.g. NAMESPACE/POD of a StatefulSet): the relay id is derived from it instead of kept in --data")
	fs.StringVar(&cfg.AdminTokenFile, "admin-token-file", "", "`file` holding the admin token (sbx_…), e.g. a mounted secret; written on first start when missing. Default <data>/admin.token")
	nats = fs.String("nats", "", "NATS `URLs`, comma-separated; empty starts an embedded NATS server")
	fs.StringVar(&cfg.NATSListen, "nats-listen", "", "`address` where the embedded NATS server also accepts other relays (:4333 = loopback only; other machines need a named address and credentials); empty = in-process only")
	fs.StringVar(&cfg.NATSCredentials.User, "nats-user", "", "NATS user `name`; the password comes from --nats-password-file")
	fs.StringVar(&cfg.NATSCredentials.PasswordFile, "nats-password-file", "", "`file` holding the NATS user's password")
	fs.StringVar(&cfg.NATSCredentials.TokenFile, "nats-token-file", "", "`file` holding a NATS authorization token")
	fs.StringVar(&cfg.NATSCredentials.NkeySeedFile, "nats-nkey-file", "", "`file` holding a NATS nkey user seed (SU…, from 'nk -gen user')")
	fs.StringVar(&cfg.NATSCredentials.CredsFile, "nats-creds", "", "NATS .creds `file` (user JWT and seed) for an operator-mode NATS; external NATS only")
	fs.IntVar(&cfg.NATSReplicas, "nats-replicas", node.DefaultNATSReplicas, "copies an external NATS cluster keeps of each bucket and stream (`n`): 3 on a three-node cluster; 1 for the embedded server")
	fs.StringVar(&cfg.NATSCAFile, "nats-ca-file", "", "PEM `file` of the CAs that sign the external NATS servers' certificates (tls:// URLs)")
	fs.StringVar(&cfg.Advertise, "advertise", "", "the `URL` other relays and agents use to reach this one; empty derives it from --listen")
	fs.StringVar(&cfg.Region, "region", "", "region `label` used by fleet ranking")
	fs.BoolVar(&cfg.KeepArrivingAgents, "keep-arriving-agents", false, "take every agent that reaches this relay instead of sending it to the ranking's choice, for fleets behind a front door that hashes on the device (docs/deploy.md); every relay of the fleet must agree")
	fs.DurationVar(&cfg.Fleet.BeatInterval, "heartbeat-interval", fleet.DefaultBeatInterval, "how often the relay writes its heartbeat to the fleet state (`interval`)")
	fs.DurationVar(&cfg.Fleet.FreshAfter, "fresh-after", 0, "a relay whose last heartbeat is older than this is stale (`duration`); 0 = 3 heartbeat intervals")
	fs.IntVar(&cfg.Fleet.MaxForward, "max-forward", fleet.DefaultMaxForward, "most `devices` this relay takes when devices are assigned")
	fs.DurationVar(&cfg.Fleet.LostWindow, "lost-window", fleet.DefaultLostWindow, "housekeeping detaches the devices of a relay stale this `long`")
	fs.DurationVar(&cfg.Fleet.ReapAfter, "reap-after", fleet.DefaultReapAfter, "housekeeping removes relays silent this `long` with nothing attached, and devices detached as long")
	fs.DurationVar(&cfg.Watchdog.Interval, "probe-interval", watchdog.DefaultInterval, "how often the relay probes each other relay (`interval`)")
	fs.DurationVar(&cfg.Watchdog.Timeout, "probe-timeout", watchdog.DefaultTimeout, "how `long` one probe waits for its answer before it is given up")
	fs.DurationVar(&cfg.Watchdog.Silence, "probe-silence", watchdog.DefaultSilence, "a relay that has answered no probe for this `long` is vetoed (a frozen or unreachable relay)")
	fs.IntVar(&cfg.Watchdog.Misses, "probe-misses", watchdog.DefaultMisses, "probes in a `row` that fail with an error (not a timeout) that veto a relay")
	fs.DurationVar(&cfg.Watchdog.VetoTTL, "veto-ttl", watchdog.DefaultVetoTTL, "how `long` a veto lasts unless a probe that answers clears it first")
	fs.BoolVar(&cfg.HotStandby, "hot-standby", false, "keep standby tunnels for devices held by other relays and name one to each agent taken here, so that a vetoed or draining holder's devices move without their agents reconnecting (docs/failover.md)")
	fs.DurationVar(&cfg.ShutdownDelay, "shutdown-delay", node.DefaultShutdownDelay, "on SIGTERM, keep the public listener open at least this `long` after /readyz turns false, for load balancers to notice")
	fs.DurationVar(&cfg.DrainSpread, "drain-spread", node.DefaultDrainSpread, "a drained relay asks its native agents to move over this `window`")
	fs.DurationVar(&cfg.Fleet.LeaseTTL, "lease-ttl", fleet.DefaultLeaseTTL, "length of the housekeeping lease: another relay takes over at most this `long` plus a third after its holder dies")
	fs.StringVar(&cfg.FleetSecret.File, "fleet-secret-file", "", "run the fleet secret in this `file` (first line signs, further lines accepted; base64 or hex) instead of the fleet's stored one; re-read when it changes. Every relay must agree: see docs/fleet-secret.md")
	port = fs.Int("port", 0, "alias of --listen :`PORT` (compatibility with the reference relay)")
	fs.IntVar(&cfg.Broker.BlockSize, "block_size", broker.DefaultBlockSize, "most user `bytes` handed to a long-poll agent per requeststream call")
	fs.DurationVar(&cfg.Broker.InactiveRequestTimeout, "inactive_request_timeout", broker.DefaultInactiveRequestTimeout, "504 when a long-poll agent sends nothing for this `long`")
	fs.DurationVar(&cfg.Broker.InactiveBackendTimeout, "inactive_backend_timeout", broker.DefaultInactiveBackendTimeout, "forget a device whose agent has not polled for this `long`")
	fs.DurationVar(&cfg.Broker.NoAgentGrace, "no-agent-grace", broker.DefaultNoAgentGrace, "how `long` a request for a device with no agent connected waits for one")
	fs.DurationVar(&cfg.Broker.PickupTimeout, "pickup-timeout", broker.DefaultPickupTimeout, "how `long` a request waits for a connected but busy long-poll agent")
	fs.IntVar(&cfg.Broker.MaxPendingPerDevice, "max-pending-per-device", broker.DefaultMaxPendingPerDevice, "user `requests` that may wait for one device's agent; more get 503")
	fs.Int64Var(&cfg.Broker.MaxBodyBytes, "max-request-body", broker.DefaultMaxBodyBytes, "largest user request body in `bytes` for long-poll agents; larger gets 413")
	fs.IntVar(&cfg.MaxHeaderBytes, "max-header-bytes", node.DefaultMaxHeaderBytes, "largest request header block in `bytes`")
	fs.DurationVar(&cfg.IdleStreamTimeout, "idle-stream-timeout", node.DefaultIdleStreamTimeout, "cut a request when no byte moved either way for this `long` while the relay waited on the client (408 for a stalled body); negative = never")
	fs.IntVar(&cfg.MaxStreamsPerAgent, "max-streams-per-agent", node.DefaultMaxStreamsPerAgent, "most `requests` in flight to one native agent of tunnel version 1; beyond, users get 503 with Retry-After")
	fs.IntVar(&cfg.MaxStreamsPerDevice, "max-streams-per-device", tunnel.DefaultMaxDeviceStreams, "most `requests` in flight to one device's agents of tunnel version 2, together; beyond, users get 503 with Retry-After")
	fs.IntVar(&cfg.Topics.QueueMessages, "topic-queue-messages", topic.DefaultQueueMessages, "topics: `messages` one reader may have waiting; beyond, it loses the oldest, whole")
	fs.IntVar(&cfg.Topics.QueueBytes, "topic-queue-bytes", topic.DefaultQueueBytes, "topics: `bytes` of messages one reader may have waiting; beyond, it loses the oldest, whole")
	fs.DurationVar(&cfg.Topics.MaxLag, "topic-max-lag", topic.DefaultMaxLag, "topics: cut a reader whose oldest waiting message is this `duration` old, or that took as long to take one; negative = never")
	fs.IntVar(&cfg.Topics.MaxMessageBytes, "topic-max-message-bytes", topic.DefaultMaxMessageBytes, "topics: largest message in `bytes` a writer may send; larger ends its connection (1009)")
	fs.IntVar(&cfg.Topics.Backlog, "topic-backlog", 0, "topics: a new reader first gets this many of the topic's last `messages` (at most the queue's length)")
	fs.DurationVar(&cfg.Liveness.Interval, "tunnel-ping-interval", tunnel.DefaultPingInterval, "native tunnels: `interval` of the agents' pings; the relay pings after twice this silence")
	fs.DurationVar(&cfg.Liveness.Timeout, "tunnel-ping-timeout", tunnel.DefaultPingTimeout, "native tunnels: the relay gives a silent agent up after half this `long` past its own ping")
	fs.DurationVar(&cfg.SessionTTL, "session-ttl", node.DefaultSessionTTL, "how `long` the browser session an access code opens lasts (revoking the token ends it sooner)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", node.DefaultDrainTimeout, "how `long` a graceful shutdown lets requests and streams finish")
	fs.BoolVar(&cfg.AllowAnonymousUsers, "allow-anonymous-users", false, "users need no token (local demos, or an authenticating proxy in front)")
	fs.BoolVar(&cfg.AllowAnonymousAgents, "allow-anonymous-agents", false, "agents need no token (reference agents behind an authenticating ingress)")
	logf.register(fs)
	return port, nats
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", stderr)
	var cfg node.Config
	var logf logFlags
	port, nats := serveFlags(fs, &cfg, &logf)
	reportVersion := fs.String("report-version", "", "the `version` this relay reports to the fleet, instead of its build's (packaging and rehearsals)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *port != 0 {
		cfg.Listen = ":" + strconv.Itoa(*port)
	}
	cfg.NATS = splitList(*nats)
	cfg.Version = Version
	if *reportVersion != "" {
		cfg.Version = *reportVersion
	}
	logger, err := logf.logger(stderr)
	if err != nil {
		return err
	}
	cfg.Logger = logger

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	n, err := node.Start(ctx, cfg)
	if err != nil {
		return withFlagNames(err)
	}
	fmt.Fprintf(stdout, "switchboard relay listening on %s (admin %s)\nadmin token: %s\n", n.Addr(), n.AdminAddr(), n.AdminTokenPath())
	select {
	case <-ctx.Done():
		return n.Close()
	case err := <-n.Errors():
		n.Close()
		return err
	case sig := <-sigs:
		logger.Info("signal received: draining; send it again to stop at once", logkey.Signal, sig.String())
	case <-n.StopRequested():
		logger.Info("stop asked for through the operator API: draining; a signal stops it at once")
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Shutdown(drainCtx) }()
	select {
	case err := <-done:
		if err != nil {
			logger.Warn("drain ended at its deadline", logkey.Err, err)
		}
	case <-sigs:
		logger.Warn("second signal: stopping now")
		cancel()
		<-done
	}
	return nil
}

// logFlags are the logging flags shared by the long-running commands.
type logFlags struct {
	level  string
	format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&l.format, "log-format", "text", "log `format`: text or json")
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, usageErrorf("--log-level %q: use debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, usageErrorf("--log-format %q: use text or json", l.format)
	}
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
