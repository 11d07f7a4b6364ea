package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/flows"
	"github.com/switchboard-relay/switchboard/internal/splice"
	"github.com/switchboard-relay/switchboard/internal/tlsconf"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// connectFlags are the flags of 'switchboard connect'.
type connectFlags struct {
	relay, token, tokenFile, code, listen, rootCA string
	udp                                           bool
}

func (f *connectFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.relay, "relay", "", "the fleet's public `URL`: any relay, or its load balancer")
	fs.StringVar(&f.tokenFile, "token-file", "", "`file` holding a user token")
	fs.StringVar(&f.token, "token", "", "a user `token` (prefer --token-file or SWITCHBOARD_TOKEN: flags show in ps)")
	fs.StringVar(&f.code, "code", "", "an access `code` instead of a token")
	fs.StringVar(&f.listen, "listen", "", "listen on this `address` (e.g. 127.0.0.1:2222) and carry each connection; without it, carry stdin and stdout (an ssh ProxyCommand)")
	fs.BoolVar(&f.udp, "udp", false, "carry UDP to a udp:// service: --listen is then a local UDP socket, each source address one flow, ended after 60 s without a datagram")
	fs.StringVar(&f.rootCA, "ca-file", "", "PEM `file` of the CAs that sign the relays' certificates (https:// relays); empty = the system roots")
}

// runConnect runs 'switchboard connect [flags] DEVICE/SERVICE'.
func runConnect(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("connect", stderr)
	var f connectFlags
	var logf logFlags
	f.register(fs)
	logf.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &UsageError{Err: err}
	}
	if fs.NArg() != 1 {
		return usageErrorf("connect: name one device's service, e.g. switchboard connect --relay https://relay.example.com robot-1/ssh")
	}
	target, err := connect.ParseTarget(fs.Arg(0))
	if err != nil {
		return &UsageError{Err: err}
	}
	if f.udp && f.listen == "" {
		return usageErrorf("connect: --udp needs --listen ADDR, the local UDP socket to carry (stdin and stdout carry no datagrams)")
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	log, err := logf.logger(stderr)
	if err != nil {
		return err
	}
	client := connect.NewClient(cfg)
	defer client.Close()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	switch {
	case f.udp:
		target.Network = connect.UDP
		return connectUDP(ctx, client, target, f.listen, stderr, log)
	case f.listen == "":
		return connectStdio(ctx, client, target, stdin, stdout)
	}
	return connectListen(ctx, client, target, f.listen, stderr, log)
}

func (f *connectFlags) config() (connect.ClientConfig, error) {
	var cfg connect.ClientConfig
	if f.relay == "" {
		return cfg, usageErrorf("connect: no relay given: set --relay to the fleet's URL, e.g. https://relay.example.com")
	}
	u, err := url.Parse(f.relay)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return cfg, usageErrorf("connect: --relay %q must look like http(s)://host[:port]", f.relay)
	}
	cfg.Relay = u
	switch {
	case f.code != "":
		cfg.Code = f.code
	case f.token != "":
		cfg.Token = f.token
	case f.tokenFile != "":
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return cfg, fmt.Errorf("connect: --token-file: %w", err)
		}
		cfg.Token = strings.TrimSpace(string(b))
	default:
		cfg.Token = os.Getenv("SWITCHBOARD_TOKEN")
	}
	if cfg.Token == "" && cfg.Code == "" {
		return cfg, usageErrorf("connect: no credential: set --token-file (or SWITCHBOARD_TOKEN) to a user token, or --code to an access code")
	}
	if f.rootCA != "" {
		pool, err := tlsconf.LoadCAPool(f.rootCA)
		if err != nil {
			return cfg, err
		}
		cfg.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return cfg, nil
}

// connectStdio carries stdin to the service and its answer to stdout,
// until both directions end.
func connectStdio(ctx context.Context, client *connect.Client, target connect.Target, stdin io.Reader, stdout io.Writer) error {
	conn, err := client.Dial(ctx, target)
	if err != nil {
		return err
	}
	defer conn.Close()
	stopped := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopped()
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(conn, stdin)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	})
	_, err = io.Copy(stdout, conn)
	if err != nil {
		return fmt.Errorf("%s: %w", target, err)
	}
	return nil
}

// connectListen carries every connection to addr to the service, each a
// stream on the client's one connection to the fleet.
func connectListen(ctx context.Context, client *connect.Client, target connect.Target, addr string, stderr io.Writer, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "switchboard: %s listens on %s\n", target, ln.Addr())
	stopped := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopped()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Go(func() {
			defer c.Close()
			conn, err := client.Dial(ctx, target)
			if err != nil {
				log.Warn("connection failed", logkey.Target, target.String(), logkey.Source, c.RemoteAddr().String(), logkey.Err, err)
				return
			}
			log.Info("connected", logkey.Target, target.String(), logkey.Source, c.RemoteAddr().String())
			res := splice.Join(c, conn)
			if res.Err != nil {
				log.Warn("disconnected", logkey.Target, target.String(), logkey.Source, c.RemoteAddr().String(), logkey.Err, res.Err)
				return
			}
			log.Info("disconnected", logkey.Target, target.String(), logkey.Source, c.RemoteAddr().String(), logkey.BytesOut, res.AToB, logkey.BytesIn, res.BToA)
		})
	}
}

// connectUDP carries the datagrams of a local UDP socket to the service,
// each source address one flow on a stream of its own.
func connectUDP(ctx context.Context, client *connect.Client, target connect.Target, addr string, stderr io.Writer, log *slog.Logger) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "switchboard: %s listens on udp %s\n", target, pc.LocalAddr())
	stopped := context.AfterFunc(ctx, func() { pc.Close() })
	defer stopped()
	srv := &flows.Server{
		Conn: pc,
		Open: func(ctx context.Context, _ netip.AddrPort) (net.Conn, error) {
			return client.Dial(ctx, target)
		},
		Config: flows.Config{Logger: log.With(logkey.Target, target.String())},
	}
	srv.Serve(ctx)
	return nil
}
