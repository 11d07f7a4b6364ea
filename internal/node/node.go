// Package node runs one relay node: it opens the fleet store (embedded NATS
// or an external one), the credentials, the long-poll broker, the public
// listener and the admin listener, and stops them gracefully (drain) or at
// once.
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/fleetsecret"
	"github.com/switchboard-relay/switchboard/internal/forward"
	"github.com/switchboard-relay/switchboard/internal/limit"
	"github.com/switchboard-relay/switchboard/internal/longpoll"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/ports"
	"github.com/switchboard-relay/switchboard/internal/pulse"
	"github.com/switchboard-relay/switchboard/internal/relay"
	"github.com/switchboard-relay/switchboard/internal/router"
	"github.com/switchboard-relay/switchboard/internal/secret"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"
	"github.com/switchboard-relay/switchboard/internal/tlsconf"
	"github.com/switchboard-relay/switchboard/internal/topic"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
	"github.com/switchboard-relay/switchboard/internal/watchdog"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Node is a running relay node.
type Node struct {
	flipsAsked    sync.Map // device → time.Time: when a drain asked its standby relay to promote (standby.go)
	promotions    promoter // runs this relay's promotions of standbys (standby.go)
	cfg           Config
	log           *slog.Logger
	store         *store.Store
	tokens        *auth.Store
	broker        *broker.Broker
	tunnels       *tunnel.Pool
	member        *fleet.Member
	fleetSecret   *fleetsecret.Keeper
	relayID       string
	signer        *peer.Signer
	secrets       *secret.Ring // the fleet secret: peer signatures, access codes
	sessions      auth.Sessions
	spent         access.Spent // access codes used here or, as told, elsewhere
	spentSub      *nats.Subscription
	authFails     *limit.Limiter // client addresses that keep failing to authenticate on the public listener
	adminFails    *limit.Limiter // the same on the admin listener: the operator's budget is apart
	watchdog      *watchdog.Watchdog
	router        *router.Fleet
	connect       *connectGateway // switchboard connect's sessions
	forwards      *forward.Server // other relays' stream forwards to agents here
	forwarder     *forward.Forwarder
	ports         *ports.Store      // the fleet's port mappings
	portListeners *ports.Listeners  // this relay's mapped ports
	conns         *tcpconns.Tracker // the TCP connections carried: connect's streams, mapped ports'
	cutTCP        context.Context   // ends when the TCP connections are cut: the drain's end, or Close
	cutTCPNow     context.CancelFunc
	portsMu       sync.Mutex     // guards portsFailed
	portsFailed   string         // the last failure to open mapped ports, told once
	placer        *router.Placer // native agents
	calls         *router.Calls  // long-poll agents' calls
	backs         sendBacks      // KeepArrivingAgents: when each device's agents were last asked back
	probeClient   *http.Client
	pulses        pulse.Server // the other relays' watchdogs' pulses
	stopWatchdog  context.CancelFunc
	changes       *changeHub
	publicHandler *relay.Handler
	topics        *topic.Hub // broadcast topics: /topic/<device>/<name>
	topicHandler  *topic.Handler
	fanoutHub     *topic.Hub      // the viewers of shared HTTP streams
	fanout        *topic.Fanout   // shares the HTTP streams agents mark as broadcasts
	stopCtx       context.Context // ends when the node starts to shut down
	stopNow       context.CancelFunc
	registry      *prometheus.Registry
	public        *http.Server
	admin         *http.Server
	publicLn      net.Listener
	sni           *sniListener // the public TLS listener with passthrough, or nil
	adminLn       net.Listener
	publicTLS     *tls.Config // nil: plain HTTP/1.1 and h2c
	adminTLS      *tls.Config // nil: plain HTTP
	peerTLS       *tls.Config // verifies relays advertised at https:// URLs
	ready         atomic.Bool
	healthy       atomic.Bool // serving; reported on heartbeats
	stopping      atomic.Bool // shutting down; reported on heartbeats
	wg            sync.WaitGroup
	errc          chan error // serve failures, buffered
	stopOnce      sync.Once
	stopReq       chan struct{} // closed by RequestStop
	stopReqOnce   sync.Once
}

// Start opens everything cfg names and starts serving. Call Shutdown or
// Close to stop.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	cfg.Complete()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger, registry: prometheus.NewRegistry(), errc: make(chan error, 2), stopReq: make(chan struct{}), changes: newChangeHub()}
	n.promotions.run = n.promote
	n.stopCtx, n.stopNow = context.WithCancel(context.Background())
	n.cutTCP, n.cutTCPNow = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			n.closeResources()
		}
	}()
	n.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	n.authFails = limit.New(cfg.AuthBackoff)
	n.authFails.RegisterMetrics(n.registry)
	adminBackoff := cfg.AuthBackoff
	adminBackoff.Scope = "admin"
	n.adminFails = limit.New(adminBackoff)
	n.adminFails.RegisterMetrics(n.registry)
	if err := n.openState(ctx); err != nil {
		return nil, err
	}
	bcfg := cfg.Broker
	bcfg.Metrics, bcfg.Logger = n.registry, n.log
	if err := n.loadRelayID(); err != nil {
		return nil, err
	}
	// Request ids carry the relay's id, so that any relay can route an
	// agent's answer to the relay holding the request.
	bcfg.IDPrefix = strings.TrimPrefix(n.relayID, "rl-")
	bcfg.OnAttach = func(string) {
		if n.member != nil {
			n.member.Changed()
		}
		n.changes.signal()
	}
	if n.broker, err = broker.New(bcfg); err != nil {
		return nil, err
	}
	n.tunnels = tunnel.NewPool(cfg.Liveness, n.log)
	n.tunnels.MaxStreams = cfg.MaxStreamsPerAgent
	n.tunnels.MaxDeviceStreams = cfg.MaxStreamsPerDevice
	n.tunnels.RegisterMetrics(n.registry)
	if err := n.openTopics(); err != nil { // before the fleet, whose cancels reach them
		return nil, err
	}
	if err := n.openListeners(); err != nil {
		return nil, err
	}
	if err := n.openFleet(ctx); err != nil {
		return nil, err
	}
	if err := n.openRouting(ctx); err != nil {
		return nil, err
	}
	if err := n.subscribeSpentCodes(); err != nil {
		return nil, err
	}
	if err := n.openPorts(ctx); err != nil {
		return nil, err
	}
	n.conns = tcpconns.New(tcpconns.Config{Registry: n.registry, Logger: n.log.With(logkey.Component, "tcp"), Record: n.recordTCP})
	n.buildServers()
	n.listenPorts()
	n.ready.Store(true)
	if n.cfg.SNIZone != "" && n.publicTLS != nil {
		n.sni = newSNIListener(n.publicLn, n.cfg.SNIZone, n.cfg.ReadHeaderTimeout, n.connect.openAnywhere, n.conns, n.log)
		n.serve(n.public, n.sni)
		n.log.Info("TLS passthrough on", logkey.Name, "*--*."+n.cfg.SNIZone)
	} else {
		n.serve(n.public, n.publicLn)
	}
	n.serve(n.admin, n.adminLn)
	n.log.Info("relay serving", logkey.Listen, n.publicLn.Addr().String(), logkey.Admin, n.adminLn.Addr().String(), logkey.Version, cfg.Version)
	return n, nil
}

// openState opens the store and the credentials, and the admin token.
func (n *Node) openState(ctx context.Context) error {
	var err error
	n.store, err = store.Open(ctx, store.Config{
		DataDir: n.cfg.DataDir, URLs: n.cfg.NATS, Listen: n.cfg.NATSListen,
		Credentials: n.cfg.NATSCredentials, CAFile: n.cfg.NATSCAFile, Replicas: n.cfg.NATSReplicas, Logger: n.log,
	})
	if err != nil {
		return fmt.Errorf("open fleet store: %w", err)
	}
	kv, err := n.store.KeyValue(ctx, auth.Bucket)
	if err != nil {
		return fmt.Errorf("open token bucket: %w", err)
	}
	if n.tokens, err = auth.Open(ctx, kv, n.log); err != nil {
		return fmt.Errorf("open tokens: %w", err)
	}
	n.tokens.OnRevoke(n.revoked)
	// A NATS server back without its files lost the token records too:
	// read the bucket whole, so that this relay forgets them as well.
	n.store.OnReconnect(n.tokens.Resync)
	path := n.cfg.AdminTokenPath()
	created, err := n.tokens.EnsureAdminToken(ctx, path)
	if err != nil {
		return err
	}
	if created {
		n.log.Info("wrote a new admin token; use it with 'switchboard ctl' or as 'Authorization: Bearer' on the admin listener", logkey.Path, path)
	}
	if n.cfg.AllowAnonymousUsers {
		n.log.Warn("ANONYMOUS USERS ALLOWED: anyone who reaches this relay can use every device (--allow-anonymous-users)")
	}
	if n.cfg.AllowAnonymousAgents {
		n.log.Warn("ANONYMOUS AGENTS ALLOWED: anyone who reaches this relay can serve any device name (--allow-anonymous-agents)")
	}
	return nil
}

// openListeners opens the public and admin listeners, and loads their TLS
// certificates and the CAs that verify other relays, so that a missing or
// broken file stops the start.
func (n *Node) openListeners() error {
	var err error
	if n.publicTLS, err = n.serverTLS(n.cfg.TLSCertFile, n.cfg.TLSKeyFile); err != nil {
		return fmt.Errorf("public listener: %w", err)
	}
	if n.adminTLS, err = n.serverTLS(n.cfg.AdminTLSCertFile, n.cfg.AdminTLSKeyFile); err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	if n.peerTLS, err = tlsconf.Client(n.cfg.PeerCAFile); err != nil {
		return fmt.Errorf("--peer-ca-file: %w", err)
	}
	if n.publicLn, err = net.Listen("tcp", n.cfg.Listen); err != nil {
		return fmt.Errorf("public listener: %w", err)
	}
	if n.adminLn, err = net.Listen("tcp", n.cfg.AdminListen); err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	return nil
}

// serverTLS returns the TLS configuration of a listener that serves the
// pair certFile, keyFile (reloaded when the files are replaced), or nil
// when no certificate is configured.
func (n *Node) serverTLS(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" {
		return nil, nil
	}
	certs, err := tlsconf.NewReloader(certFile, keyFile, n.log)
	if err != nil {
		return nil, err
	}
	return tlsconf.Server(certs), nil
}

// buildServers builds the servers of both listeners.
func (n *Node) buildServers() {
	agents := longpoll.NewHandler(longpoll.Config{
		Broker:        n.broker,
		Authorize:     n.authorizeAgent,
		Route:         n.routeAgent,
		MaxChunkBytes: n.cfg.MaxChunkBytes,
		Logger:        n.log,
	})
	var users http.RoundTripper = n.router
	if n.cfg.KeepArrivingAgents {
		users = n.frontDoorTransport(n.router)
	}
	users = n.fanoutTransport(users)
	n.publicHandler = relay.NewHandler(relay.Config{
		Transport:  users,
		VerifyPeer: n.verifyPeer,
		Agents:     agents,
		Tunnels: &tunnel.Handler{Pool: n.tunnels, Authorize: n.authorizeAgent, Place: n.placeAgent, Ready: n.ready.Load, V1Only: n.cfg.TunnelV1Only, Logger: n.log,
			Standby: n.standbyHook(), SelfID: func() string { return n.relayID }},
		AuthorizeUser: n.authorizeUser,
		Ready:         func() bool { return n.ready.Load() && !n.draining() },
		StallTimeout:  n.cfg.IdleStreamTimeout,
		Detach:        n.sessions.Detach,
		Logger:        n.log,
	})
	n.connect = newConnectGateway(n)
	n.forwards = &forward.Server{Open: n.tunnels, Verify: n.signer.VerifySignature, Logger: n.log.With(logkey.Component, "forward")}
	n.public = n.newServer(n.sessions.Wrap(n.routeConnect(n.routeTopics(n.publicHandler))), n.publicTLS)
	n.public.Protocols = new(http.Protocols)
	n.public.Protocols.SetHTTP1(true)
	if n.publicTLS != nil {
		n.public.Protocols.SetHTTP2(true) // by ALPN; agents' tunnels and websockets ask for HTTP/1.1
	} else {
		n.public.Protocols.SetUnencryptedHTTP2(true)
	}
	n.admin = n.newServer(n.sessions.Wrap(relay.GuardIdle(control.NewHandler(control.Config{
		Tokens:       n.tokens,
		Fleet:        n.member,
		Secret:       n.fleetSecret,
		Codes:        n.IssueCode,
		AuthFailures: n.adminFails,
		Bind:         n.sessions.Bind,
		Metrics:      n.registry,
		Ready:        n.ready.Load,
		Draining:     n.draining,
		Topics:       n.Topics,
		Ports:        n.ports,
		OwnPorts:     n.ownPorts,
		PortConns:    n.portConns,
		Stop:         n.RequestStop,
		Logger:       n.log,
	}), n.cfg.IdleStreamTimeout)), n.adminTLS)
}

// newServer returns a server of h, serving TLS with tlsConf unless it is nil.
func (n *Node) newServer(h http.Handler, tlsConf *tls.Config) *http.Server {
	return &http.Server{
		Handler:           h,
		TLSConfig:         tlsConf,
		MaxHeaderBytes:    n.cfg.MaxHeaderBytes,
		ReadHeaderTimeout: n.cfg.ReadHeaderTimeout,
		IdleTimeout:       n.cfg.IdleTimeout,
		HTTP2:             &http.HTTP2Config{WriteByteTimeout: n.cfg.IdleStreamTimeout}, // see IdleStreamTimeout
		ErrorLog:          slog.NewLogLogger(n.log.Handler(), slog.LevelDebug),
	}
}

func (n *Node) serve(srv *http.Server, ln net.Listener) {
	n.wg.Go(func() {
		var err error
		if srv.TLSConfig != nil {
			err = srv.ServeTLS(ln, "", "") // the certificate comes from TLSConfig
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.errc <- err
		}
	})
}

// draining reports whether an operator drains this relay: its /readyz (on
// both listeners) then answers 503, so that load balancers following it send no new agents or
// users here while the agents move.
func (n *Node) draining() bool { return n.member != nil && n.member.ShouldDrain() }

// Ready reports whether the node takes new work (false once it drains).
func (n *Node) Ready() bool { return n.ready.Load() }

// Secrets returns the fleet secret this relay runs.
func (n *Node) Secrets() *secret.Ring { return n.secrets }

// Addr returns the public listener's address.
func (n *Node) Addr() string { return n.publicLn.Addr().String() }

// AdminAddr returns the admin listener's address.
func (n *Node) AdminAddr() string { return n.adminLn.Addr().String() }

// AdminTokenPath returns the path of the admin token file.
func (n *Node) AdminTokenPath() string { return n.cfg.AdminTokenPath() }

// Tokens returns the node's credential store.
func (n *Node) Tokens() *auth.Store { return n.tokens }

// Errors delivers a listener's failure while the node runs.
func (n *Node) Errors() <-chan error { return n.errc }

// RequestStop asks whoever runs the node to stop it as on SIGTERM: a
// preStop hook calls it through the operator API. It returns at once.
func (n *Node) RequestStop() { n.stopReqOnce.Do(func() { close(n.stopReq) }) }

// StopRequested is closed once RequestStop was called.
func (n *Node) StopRequested() <-chan struct{} { return n.stopReq }

// Shutdown drains the node, as on SIGTERM: /readyz turns false at once and
// the relay announces that it is stopping (the fleet places no device here
// any more); its native agents are asked to move to other relays, spread
// over DrainSpread, each after its streams in flight finish; its long-poll
// agents' polls end and their next polls go to the devices' new holders;
// requests arriving meanwhile follow the devices. Whatever still runs when
// ctx ends is cut. Then everything is closed.
func (n *Node) Shutdown(ctx context.Context) error {
	began := time.Now()
	n.ready.Store(false)
	n.stopping.Store(true)
	n.stopNow()
	if n.member != nil {
		n.member.BeatNow()
	}
	spread := n.cfg.DrainSpread
	if d, ok := ctx.Deadline(); ok {
		spread = min(spread, time.Until(d)/3)
	}
	n.tunnels.CloseStandbys()
	n.flipAll()
	agents := n.tunnels.DrainSessions(spread, n.drainMovable(nil)) // the relay goes away whoever takes its agents
	n.log.Info("relay draining", logkey.Timeout, n.cfg.DrainTimeout, logkey.NativeAgents, agents, logkey.Spread, spread)
	n.broker.Drain()
	// Long-poll agents post every response chunk as a new request to the
	// public listener, so it stays open until nothing is in flight; users'
	// requests arriving meanwhile go to where their devices are now.
	errTunnels := n.tunnels.WaitEmpty(ctx)
	errWait := n.broker.Wait(ctx)
	// Load balancers notice /readyz only at their next health check: keep
	// taking requests (and passing them on) until they have had the time.
	select {
	case <-time.After(time.Until(began.Add(n.cfg.ShutdownDelay))):
	case <-ctx.Done():
	}
	n.closeTopics() // topic connections end with "service restart": their clients come back elsewhere
	// The mapped ports stop taking connections when the public listener
	// does: balancers following /readyz have stopped sending them here.
	n.portListeners.StopAccepting()
	errPublic := n.public.Shutdown(ctx)
	// Upgraded streams (websockets) passing through here to another relay
	// run on hijacked connections, which Shutdown does not wait for.
	errPublic = errors.Join(errPublic, n.publicHandler.WaitIdle(ctx))
	errTCP := n.drainTCP(ctx)
	if errPublic != nil || errWait != nil || errTunnels != nil {
		n.log.Warn("drain deadline passed; cutting what is left")
	}
	n.Close()
	if err := errors.Join(errTunnels, errWait, errPublic, errTCP); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	n.log.Info("relay stopped")
	return nil
}

// Close stops the node at once, cutting whatever is in flight.
func (n *Node) Close() error {
	n.stopNow()
	n.cutTCPNow()
	n.ready.Store(false)
	n.healthy.Store(false)
	n.stopOnce.Do(func() {
		if n.broker != nil {
			n.broker.Close()
		}
		n.public.Close()
		n.pulses.Close()
		n.admin.Close()
		if n.stopWatchdog != nil {
			n.stopWatchdog()
		}
		n.wg.Wait()
		n.closeResources()
	})
	return nil
}

// closeResources closes what openState and listen opened.
func (n *Node) closeResources() {
	n.promotions.close()
	if n.broker != nil {
		n.broker.Close()
	}
	n.closeTopics()
	n.closePorts()
	if n.sni != nil {
		n.sni.closeAll()
	}
	if n.connect != nil {
		n.connect.Close()
	}
	if n.forwards != nil {
		n.forwards.Close()
	}
	if n.forwarder != nil {
		n.forwarder.Close()
	}
	if n.tunnels != nil {
		n.tunnels.Close()
	}
	if n.stopWatchdog != nil {
		n.stopWatchdog()
	}
	if n.router != nil {
		n.router.Close()
	}
	if n.probeClient != nil {
		n.probeClient.CloseIdleConnections()
	}
	if n.spentSub != nil {
		_ = n.spentSub.Unsubscribe()
	}
	if n.member != nil {
		n.member.Close()
	}
	if n.fleetSecret != nil {
		n.fleetSecret.Close()
	}
	for _, ln := range []net.Listener{n.publicLn, n.adminLn} {
		if ln != nil {
			ln.Close()
		}
	}
	if n.tokens != nil {
		n.tokens.Close()
	}
	if n.store != nil {
		n.store.Close()
	}
}

// Devices reports the device names with a native tunnel or a long-poll agent
// seen recently.
func (n *Node) Devices() []string {
	names := n.tunnels.Devices()
	for _, d := range n.broker.Devices() {
		if !slices.Contains(names, d) {
			names = append(names, d)
		}
	}
	return names
}

// TunnelConnects returns how many native tunnels ever connected.
func (n *Node) TunnelConnects() int64 { return n.tunnels.Connects() }

// TunnelSessions returns how many native tunnels are connected.
func (n *Node) TunnelSessions() int { return n.tunnels.Sessions() }

// TunnelVersions returns the tunnel versions of device's native agents on
// this relay.
func (n *Node) TunnelVersions(device string) []int { return n.tunnels.Versions(device) }

// StreamForwards returns how many streams this relay opened to other
// relays to forward users' requests (package forward), and how many
// forwarded requests went over HTTP because the holder offered none.
func (n *Node) StreamForwards() (streams, overHTTP int64) {
	if n.forwarder == nil {
		return 0, 0
	}
	return n.forwarder.Streams(), n.forwarder.Unavailable()
}
