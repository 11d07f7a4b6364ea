package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tlsconf"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// agentFlags are the raw flags of 'switchboard agent', ours and the
// reference agent's.
type agentFlags struct {
	relays, device, backend, token, tokenFile, protocol, prefix, rootCA, backendCA string
	backendH2C, disableHTTP2, forceHTTP2, preserveHost, websocket, noStandby       bool
	maxChunk, blockSize, pending, tunnelVersion                                    int
	liveness                                                                       tunnel.Liveness
	broadcast, passthrough                                                         []string
	services                                                                       []service.Service

	// The reference agent's names, used when ours are not given.
	relayScheme, relayAddress, backendScheme, backendAddress, backendPath string
}

func (f *agentFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.relays, "relay", "", "relay `URLs`, comma-separated: any relays of the fleet, or its load balancer")
	fs.StringVar(&f.device, "device", "", "the device `name` users address (/client/NAME/…, X-Server-Name: NAME)")
	fs.StringVar(&f.backend, "backend", "", "the local service's `URL`, e.g. http://127.0.0.1:3000")
	fs.BoolVar(&f.backendH2C, "backend-h2c", false, "speak HTTP/2 cleartext to the backend (gRPC)")
	fs.StringVar(&f.backendCA, "backend-ca-file", "", "PEM `file` of the CAs that sign an https:// backend's certificate (e.g. a cluster's API server); empty = the system roots")
	fs.StringVar(&f.tokenFile, "token-file", "", "`file` holding the agent token")
	fs.Func("broadcast-path", "a device `path` (e.g. /stream.mjpeg) whose GET answers one stream for every viewer: each relay fetches it once and shares it; repeat for more", func(p string) error {
		f.broadcast = append(f.broadcast, p)
		return nil
	})
	fs.StringVar(&f.token, "token", "", "the agent `token` (prefer --token-file or SWITCHBOARD_TOKEN: flags show in ps)")
	fs.StringVar(&f.protocol, "protocol", agent.DefaultProtocol, "`protocol` to the relay: native (falls back to longpoll against a relay without it) or longpoll")
	fs.Func("service", "another service the relay may reach on the device, as `NAME=URL` (ssh=tcp://127.0.0.1:22, db=tls://db.local:5432, voice=udp://127.0.0.1:24454, grpc=h2c://127.0.0.1:50051); repeatable", func(v string) error {
		sv, err := service.Parse(v)
		if err != nil {
			return err
		}
		f.services = append(f.services, sv)
		return nil
	})
	fs.Func("tls-passthrough", "let anyone reach the tcp:// service `NAME`, a TLS server, through the relays' TLS listener by SNI (NAME--DEVICE.ZONE, see the relay's --sni-zone) with no token: the relay never decrypts, the service authenticates its users; repeatable", func(v string) error {
		if err := service.CheckName(v); err != nil {
			return err
		}
		f.passthrough = append(f.passthrough, v)
		return nil
	})
	fs.IntVar(&f.tunnelVersion, "tunnel-version", agent.DefaultTunnelVersion, "newest native tunnel `version` to offer: 2 (falls back to 1 against a relay without it) or 1")
	fs.BoolVar(&f.websocket, "websocket", false, "carry the native tunnel in a WebSocket (for paths that pass only websockets)")
	fs.StringVar(&f.prefix, "relay-prefix", "", "`path` put before the agent endpoints, for an ingress that routes by prefix")
	fs.StringVar(&f.rootCA, "ca-file", "", "PEM `file` of the CAs that sign the relays' certificates (https:// relays); empty = the system roots")
	fs.StringVar(&f.rootCA, "root-ca-file", "", "another name of --ca-file")
	fs.BoolVar(&f.preserveHost, "preserve-host", true, "send the user's Host header to the backend")
	fs.IntVar(&f.maxChunk, "max-chunk-size", agent.DefaultMaxChunkSize, "most response `bytes` posted per chunk")
	fs.IntVar(&f.blockSize, "block-size", agent.DefaultBlockSize, "read size from the backend in `bytes`")
	fs.IntVar(&f.pending, "num-pending-requests", agent.DefaultNumPendingRequests, "concurrent polls")
	fs.BoolVar(&f.disableHTTP2, "disable-http2", false, "never use HTTP/2 to the backend")
	fs.DurationVar(&f.liveness.Interval, "ping-interval", 0, "native tunnel: ping the relay after this `long` without hearing from it (default "+agent.DefaultStandbyPingInterval.String()+" for an agent that keeps a standby tunnel, else "+tunnel.DefaultPingInterval.String()+")")
	fs.DurationVar(&f.liveness.Timeout, "ping-timeout", 0, "native tunnel: give the relay up when a ping gets no answer this `long` (default "+agent.DefaultStandbyPingTimeout.String()+" with a standby tunnel, else "+tunnel.DefaultPingTimeout.String()+")")
	fs.BoolVar(&f.noStandby, "no-standby", false, "keep no standby tunnel at a second relay (see docs/failover.md)")

	// The reference agent's flag names.
	fs.StringVar(&f.relayScheme, "relay_scheme", "https", "reference name: scheme of --relay_address")
	fs.StringVar(&f.relayAddress, "relay_address", "", "reference name: relay host:port (with --relay_scheme)")
	fs.StringVar(&f.prefix, "relay_prefix", "", "reference name of --relay-prefix")
	fs.StringVar(&f.device, "server_name", "", "reference name of --device")
	fs.StringVar(&f.backendScheme, "backend_scheme", "https", "reference name: scheme of --backend_address")
	fs.StringVar(&f.backendAddress, "backend_address", "", "reference name: backend host:port (with --backend_scheme)")
	fs.StringVar(&f.backendPath, "backend_path", "", "reference name: path put before every backend request")
	fs.BoolVar(&f.preserveHost, "preserve_host", true, "reference name of --preserve-host")
	fs.StringVar(&f.tokenFile, "authentication_token_file", "", "reference name of --token-file")
	fs.StringVar(&f.rootCA, "root_ca_file", "", "reference name of --ca-file")
	fs.IntVar(&f.maxChunk, "max_chunk_size", agent.DefaultMaxChunkSize, "reference name of --max-chunk-size")
	fs.IntVar(&f.blockSize, "block_size", agent.DefaultBlockSize, "reference name of --block-size")
	fs.IntVar(&f.pending, "num_pending_requests", agent.DefaultNumPendingRequests, "reference name of --num-pending-requests")
	fs.BoolVar(&f.disableHTTP2, "disable_http2", false, "reference name of --disable-http2")
	fs.BoolVar(&f.forceHTTP2, "force_http2", false, "reference name: HTTP/2 cleartext to the backend (as --backend-h2c)")
}

// config turns the flags into an agent.Config.
func (f *agentFlags) config() (agent.Config, error) {
	cfg := agent.Config{
		Device:             f.device,
		BackendH2C:         f.backendH2C || f.forceHTTP2,
		DisableHTTP2:       f.disableHTTP2,
		PreserveHost:       f.preserveHost,
		Protocol:           f.protocol,
		WebSocket:          f.websocket,
		NoStandby:          f.noStandby,
		Liveness:           f.liveness,
		Services:           f.services,
		Passthrough:        f.passthrough,
		TunnelVersion:      f.tunnelVersion,
		RelayPrefix:        f.prefix,
		MaxChunkSize:       f.maxChunk,
		BlockSize:          f.blockSize,
		NumPendingRequests: f.pending,
	}
	relays := splitList(f.relays)
	if len(relays) == 0 && f.relayAddress != "" {
		relays = []string{f.relayScheme + "://" + f.relayAddress}
	}
	for _, r := range relays {
		u, err := url.Parse(r)
		if err != nil {
			return cfg, usageErrorf("--relay %q: %v", r, err)
		}
		cfg.Relays = append(cfg.Relays, u)
	}
	backend := f.backend
	if backend == "" && f.backendAddress != "" {
		backend = f.backendScheme + "://" + f.backendAddress + f.backendPath
	}
	if backend != "" {
		u, err := url.Parse(backend)
		if err != nil {
			return cfg, usageErrorf("--backend %q: %v", backend, err)
		}
		cfg.Backend = u
	}
	token, err := f.readToken()
	if err != nil {
		return cfg, err
	}
	cfg.Token = token
	cfg.BroadcastPaths = f.broadcast
	if f.backendCA != "" {
		if cfg.BackendRootCAs, err = tlsconf.LoadCAPool(f.backendCA); err != nil {
			return cfg, fmt.Errorf("--backend-ca-file: %w", err)
		}
	}
	if f.rootCA != "" {
		if cfg.RootCAs, err = tlsconf.LoadCAPool(f.rootCA); err != nil {
			return cfg, fmt.Errorf("--ca-file: %w", err)
		}
	}
	return cfg, nil
}

// readToken returns the token from --token, --token-file or SWITCHBOARD_TOKEN.
func (f *agentFlags) readToken() (string, error) {
	switch {
	case f.token != "":
		return f.token, nil
	case f.tokenFile != "":
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return "", fmt.Errorf("read token file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	default:
		return os.Getenv("SWITCHBOARD_TOKEN"), nil
	}
}

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("agent", stderr)
	var f agentFlags
	var logf logFlags
	f.register(fs)
	logf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	if cfg.Logger, err = logf.logger(stderr); err != nil {
		return err
	}
	a, err := agent.New(cfg)
	if err != nil {
		return &UsageError{Err: withFlagNames(err)}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return a.Run(ctx)
}
