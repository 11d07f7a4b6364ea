package store

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrEmbeddedStart is wrapped by the errors of a failed embedded server start.
var ErrEmbeddedStart = errors.New("embedded NATS server did not start")

// startEmbedded starts a JetStream-enabled NATS server for cfg, demanding
// sec of every client, and waits, bounded by readyTimeout, until it accepts
// connections.
func startEmbedded(cfg Config, sec secrets, log *slog.Logger) (*server.Server, error) {
	opts, err := serverOptions(cfg, sec)
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEmbeddedStart, err)
	}
	nl := &natsLogger{log: log.With(attrComponent, "nats-server")}
	ns.SetLoggerV2(nl, false, false, false)
	ns.Start()
	if err := waitReady(ns, nl, opts); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, err
	}
	return ns, nil
}

// serverOptions are the embedded server's options. A Listen without a host
// binds loopback only: the server's own default would be every interface.
func serverOptions(cfg Config, sec secrets) (*server.Options, error) {
	opts := &server.Options{
		ServerName: cfg.ServerName,
		JetStream:  true,
		StoreDir:   filepath.Join(cfg.DataDir, "nats"),
		NoSigs:     true,
		DontListen: cfg.Listen == "",
	}
	if cfg.Listen != "" {
		host, port, err := splitListen(cfg.Listen)
		if err != nil {
			return nil, err
		}
		if port == 0 {
			port = server.RANDOM_PORT
		}
		if host == "" {
			host = "127.0.0.1"
		}
		opts.Host, opts.Port = host, port
	}
	sec.requireOf(opts)
	return opts, nil
}

// waitReady waits until ns accepts connections with JetStream enabled, and
// reports the server's own fatal message when it gave up.
func waitReady(ns *server.Server, nl *natsLogger, opts *server.Options) error {
	if msg := nl.fatal(); msg != "" {
		return fmt.Errorf("%w: %s", ErrEmbeddedStart, msg)
	}
	if !ns.ReadyForConnections(readyTimeout) {
		if msg := nl.fatal(); msg != "" {
			return fmt.Errorf("%w: %s", ErrEmbeddedStart, msg)
		}
		return fmt.Errorf("%w: not ready after %s (is %s in use?)", ErrEmbeddedStart, readyTimeout, net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)))
	}
	if !ns.JetStreamEnabled() {
		return fmt.Errorf("%w: JetStream is not enabled (is %s writable?)", ErrEmbeddedStart, opts.StoreDir)
	}
	return nil
}

// clientURL returns the URL at which ns accepts TCP clients, with a loopback
// host when it listens on every interface, or "" if it does not listen.
func clientURL(ns *server.Server) string {
	addr, ok := ns.Addr().(*net.TCPAddr)
	if !ok || addr == nil {
		return ""
	}
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "nats://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// natsLogger adapts the embedded server's logger interface to slog. Its
// notices (the start-up banner and the like) become debug records; a fatal
// message is kept so that Open can report why the server gave up.
type natsLogger struct {
	log *slog.Logger

	mu         sync.Mutex // guards firstFatal
	firstFatal string
}

var _ server.Logger = (*natsLogger)(nil)

func (l *natsLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *natsLogger) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }

// Fatalf records the message instead of exiting: the server stops starting
// and Open returns an error carrying the message.
func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.firstFatal == "" {
		l.firstFatal = msg
	}
}

func (l *natsLogger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.firstFatal
}
