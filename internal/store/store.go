package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Log attribute keys used by this package.
const (
	attrURL       = "nats_url"
	attrComponent = "component"
	attrSubject   = "subject"
	attrError     = "error"
	attrAuth      = "auth"
	attrListen    = "listen"
)

// Timeouts that bound the store's lifecycle.
const (
	readyTimeout = 10 * time.Second // embedded server start, incl. JetStream recovery
	drainTimeout = 5 * time.Second  // flushing the connection on Close
)

// ErrClosed is returned by methods called after Close.
var ErrClosed = errors.New("store closed")

// ErrNoJetStream is returned by Open when the NATS server does not offer JetStream.
var ErrNoJetStream = errors.New("NATS server has JetStream disabled")

// Store is a live connection to the NATS JetStream that holds the fleet state,
// and, in embedded mode, the NATS server itself. It is safe for concurrent use.
type Store struct {
	cfg Config
	log *slog.Logger

	ns        *server.Server // nil with external NATS
	clientURL string         // where other relays reach ns; empty if nowhere
	nc        *nats.Conn
	js        jetstream.JetStream

	connected  atomic.Bool   // false between a disconnect and the next reconnect
	refused    atomic.Bool   // credentials refused since the last reconnect; logged once
	closing    atomic.Bool   // set by Close, silences connection callbacks
	connClosed chan struct{} // closed by the connection's ClosedHandler

	closeOnce sync.Once
	closeErr  error // set once by Close

	hooksMu      sync.Mutex
	onReconnects []func()
}

// Open completes and validates cfg, then connects to the fleet state: it
// starts the embedded NATS server when cfg.URLs is empty, or connects to the
// external servers otherwise. It fails if JetStream is not available.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg.Complete()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{
		cfg:        cfg,
		log:        cfg.Logger.With(attrComponent, "store"),
		connClosed: make(chan struct{}),
	}
	if err := s.open(ctx); err != nil {
		s.shutdown()
		return nil, fmt.Errorf("store: open: %w", err)
	}
	return s, nil
}

func (s *Store) open(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sec, err := s.cfg.Credentials.load()
	if err != nil {
		return err
	}
	opts, err := s.connOptions(sec)
	if err != nil {
		return err
	}
	url := strings.Join(s.cfg.URLs, ",")
	if len(s.cfg.URLs) == 0 {
		ns, err := startEmbedded(s.cfg, sec, s.log)
		if err != nil {
			return err
		}
		s.ns, s.clientURL = ns, clientURL(ns)
		url = s.clientURL
		if url == "" {
			opts = append(opts, nats.InProcessServer(ns))
		} else {
			s.log.Info("embedded NATS server accepts other relays", attrListen, ns.Addr().String(), attrURL, url, attrAuth, sec.kind)
		}
	}
	s.warnURLCredentials()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if isAuthError(err) {
			return fmt.Errorf("connecting to NATS at %s: %w: %s (%w)", displayURL(url), ErrAuthFailed, sec.refused(), err)
		}
		return fmt.Errorf("connecting to NATS at %s: %w", displayURL(url), err)
	}
	s.nc = nc
	s.connected.Store(true)
	return s.openJetStream(ctx)
}

// publishAsyncTimeout bounds the wait for an asynchronous publish's
// acknowledgment.
const publishAsyncTimeout = 5 * time.Second

// openJetStream makes the JetStream context and checks that the server offers it.
func (s *Store) openJetStream(ctx context.Context) error {
	// Asynchronous publishes (the event log's batches) that NATS does not
	// acknowledge in time fail rather than wait in the client for ever.
	js, err := jetstream.New(s.nc, jetstream.WithPublishAsyncTimeout(publishAsyncTimeout))
	if err != nil {
		return err
	}
	s.js = js
	_, err = js.AccountInfo(ctx)
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("%w: start nats-server with -js (or jetstream {} in its config)", ErrNoJetStream)
	case err != nil:
		return fmt.Errorf("checking JetStream: %w", err)
	}
	return nil
}

// displayURL names the NATS servers of a comma-separated URL list in a
// message, without the credentials a URL may carry.
func displayURL(urls string) string {
	if urls == "" {
		return "the embedded server"
	}
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		parts[i] = redactURL(u)
	}
	return strings.Join(parts, ",")
}

// warnURLCredentials warns when a NATS URL carries credentials: every user
// of the machine sees a command line.
func (s *Store) warnURLCredentials() {
	for _, u := range s.cfg.URLs {
		if urlHasUserinfo(u) {
			s.log.Warn("a NATS URL carries credentials, which the command line shows to every user of this machine; prefer --nats-user with --nats-password-file, or --nats-token-file", attrURL, redactURL(u))
		}
	}
}

// connOptions are the NATS client options: present sec, trust cfg.CAFile,
// reconnect forever (even while the server refuses the credentials, as it
// may during a rotation), and log each disconnect and reconnect once.
//
// Nothing is buffered while the connection is down: a publish then fails
// at once (nats.ErrReconnectBufExceeded) instead of being sent after the
// reconnect, when its caller may long have been told that it failed (a
// token created by an operator who never saw its secret, a drain flag
// reported as not set). The writers that must get through (heartbeats,
// attachments, events) retry or re-publish on reconnect by themselves.
func (s *Store) connOptions(sec secrets) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name("switchboard " + s.cfg.ServerName),
		nats.MaxReconnects(-1),
		nats.ReconnectBufSize(-1),
		nats.IgnoreAuthErrorAbort(),
		nats.DrainTimeout(drainTimeout),
		nats.DisconnectErrHandler(s.onDisconnect),
		nats.ReconnectHandler(s.onReconnect),
		nats.ClosedHandler(func(*nats.Conn) { close(s.connClosed) }),
		nats.ErrorHandler(s.onAsyncError),
	}
	auth, err := sec.clientOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	if s.cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(s.cfg.CAFile))
	}
	return opts, nil
}

func (s *Store) onDisconnect(_ *nats.Conn, err error) {
	if s.closing.Load() || !s.connected.CompareAndSwap(true, false) {
		return
	}
	s.log.Warn("lost connection to NATS; fleet state is read-only until it returns", attrError, err)
}

func (s *Store) onReconnect(nc *nats.Conn) {
	if s.closing.Load() || !s.connected.CompareAndSwap(false, true) {
		return
	}
	s.refused.Store(false)
	s.log.Info("reconnected to NATS", attrURL, nc.ConnectedUrlRedacted())
	s.hooksMu.Lock()
	hooks := s.onReconnects
	s.hooksMu.Unlock()
	for _, fn := range hooks {
		fn()
	}
}

// OnReconnect registers fn to run each time the connection to NATS returns
// after a loss, so that callers can resynchronise what they keep in memory
// and re-publish what NATS may have lost. fn must not block.
func (s *Store) OnReconnect(fn func()) {
	s.hooksMu.Lock()
	defer s.hooksMu.Unlock()
	s.onReconnects = append(s.onReconnects, fn)
}

// Connected reports whether the connection to NATS is up right now.
func (s *Store) Connected() bool { return s.connected.Load() && !s.closing.Load() }

func (s *Store) onAsyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if s.closing.Load() {
		return
	}
	if isAuthError(err) {
		if s.refused.CompareAndSwap(false, true) {
			s.log.Error("NATS refuses this relay's credentials; it keeps trying, and fleet state is read-only until the server accepts them", attrError, err)
		}
		return
	}
	subject := ""
	if sub != nil {
		subject = sub.Subject
	}
	s.log.Warn("NATS asynchronous error", attrSubject, subject, attrError, err)
}

// JetStream returns the JetStream context of the store's connection.
func (s *Store) JetStream() jetstream.JetStream { return s.js }

// Conn returns the store's NATS connection, for fleet-wide signals on plain
// subjects. The caller must not close it.
func (s *Store) Conn() *nats.Conn { return s.nc }

// ClientURL returns the nats:// URL at which the embedded server accepts
// other relays, or "" when it accepts none (in-process only, or external NATS).
func (s *Store) ClientURL() string { return s.clientURL }

// KeyValue returns the key-value bucket named bucket, creating it, or updating
// its configuration, as needed. The bucket keeps the latest value of each key.
func (s *Store) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	if s.closing.Load() {
		return nil, fmt.Errorf("store: bucket %s: %w", bucket, ErrClosed)
	}
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:   bucket,
		History:  1,
		Replicas: s.cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("store: bucket %s: %w", bucket, err)
	}
	return kv, readable(ctx, kv)
}

// readable waits, within ctx and at most readableWithin, until kv
// answers a read. A bucket just created on a cluster answers nothing ("no
// responders") until its replicas have elected a leader, and the first
// relay of a fleet reads what it created at once.
func readable(ctx context.Context, kv jetstream.KeyValue) error {
	ctx, cancel := context.WithTimeout(ctx, readableWithin)
	defer cancel()
	for {
		_, err := kv.Get(ctx, readableKey)
		if err == nil || errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if !Unavailable(err) || ctx.Err() != nil {
			return fmt.Errorf("store: bucket %s: %w", kv.Bucket(), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("store: bucket %s: %w", kv.Bucket(), err)
		case <-time.After(readableRetry):
		}
	}
}

// readableKey is the key readable asks for: none is ever stored under it.
const readableKey = "store.readable"

// readableRetry is how often readable asks again, and readableWithin how
// long it waits at most.
const (
	readableRetry  = 50 * time.Millisecond
	readableWithin = 10 * time.Second
)

// ExpiringKeyValue returns the bucket as KeyValue does, whose keys NATS
// drops ttl after they were written: records that matter only for a while,
// such as access codes spent.
func (s *Store) ExpiringKeyValue(ctx context.Context, bucket string, ttl time.Duration) (jetstream.KeyValue, error) {
	if s.closing.Load() {
		return nil, fmt.Errorf("store: bucket %s: %w", bucket, ErrClosed)
	}
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:   bucket,
		History:  1,
		TTL:      ttl,
		Replicas: s.cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("store: bucket %s: %w", bucket, err)
	}
	return kv, readable(ctx, kv)
}

// Stream returns the JetStream stream cfg describes, creating it or
// updating its configuration as needed. Replicas is set from the store's
// configuration.
func (s *Store) Stream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if s.closing.Load() {
		return nil, fmt.Errorf("store: stream %s: %w", cfg.Name, ErrClosed)
	}
	cfg.Replicas = s.cfg.Replicas
	st, err := s.js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: stream %s: %w", cfg.Name, err)
	}
	return st, nil
}

// Close flushes and closes the connection and, in embedded mode, shuts the
// NATS server down and waits until it has stopped. It is safe to call more
// than once; later calls return the first call's result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		s.closeErr = s.shutdown()
	})
	return s.closeErr
}

// shutdown drains the connection, if any, and stops the embedded server, if any.
func (s *Store) shutdown() error {
	s.closing.Store(true)
	var err error
	if s.nc != nil {
		switch derr := s.nc.Drain(); {
		case derr == nil, errors.Is(derr, nats.ErrConnectionClosed):
		case errors.Is(derr, nats.ErrConnectionReconnecting):
			s.log.Warn("closing while NATS is unreachable; unsent updates are lost")
		default:
			s.nc.Close()
			err = fmt.Errorf("store: close: %w", derr)
		}
		<-s.connClosed // Drain closes the connection within drainTimeout.
	}
	if s.ns != nil {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	}
	return err
}
