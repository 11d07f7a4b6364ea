// Package agent is the device side of Switchboard: it dials a relay, takes
// the user requests for its device and forwards them to the local backend,
// streaming the answers back. It reconnects with jittered backoff and never
// gives up while its context lives, except when the relay refuses its
// credential.
package agent

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/lograte"
	"github.com/switchboard-relay/switchboard/internal/service"
)

// ErrUnauthorized is returned by Run when the relay refuses the agent's
// credential or the device name (401/403); retrying cannot help.
var ErrUnauthorized = errors.New("relay refused the agent")

// Agent connects one device to a relay.
type Agent struct {
	cfg      Config
	instance string
	relay    *http.Client // to the relay
	wsClient *http.Client // to the relay, for the websocket tunnel: redirects are the agent's to follow
	backend  *http.Client // to the local service

	byName   map[string]service.Service // the services by name
	announce string                     // what a version 2 relay learns of them

	flowLines *lograte.Limiter // bounds the log lines of UDP flows, which the relay's users drive

	mu    sync.Mutex // guards state
	state string     // last logged connection state
}

// New returns an agent for cfg.
func New(cfg Config) (*Agent, error) {
	cfg.Complete()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var id [8]byte
	rand.Read(id[:])
	relayTransport := newRelayTransport(&cfg)
	var backend http.RoundTripper = newBackendTransport(&cfg)
	if len(cfg.BroadcastPaths) > 0 {
		backend = &broadcastMarker{next: backend, prefix: strings.TrimSuffix(cfg.Backend.Path, "/"), paths: cfg.BroadcastPaths}
	}
	services, err := cfg.services()
	if err != nil {
		return nil, err
	}
	announce, err := service.Announce(services, cfg.PreserveHost)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]service.Service, len(services))
	for _, sv := range services {
		byName[sv.Name] = sv
	}
	return &Agent{
		byName:    byName,
		announce:  announce,
		cfg:       cfg,
		instance:  hex.EncodeToString(id[:]),
		flowLines: lograte.New(lograte.DefaultPerSecond),
		relay:     &http.Client{Transport: relayTransport},
		wsClient: &http.Client{Transport: relayTransport, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		backend: &http.Client{
			Transport: backend,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse // the user's client follows redirects, not us
			},
		},
	}, nil
}

// Run serves requests until ctx ends (returning nil) or the relay refuses the
// agent (returning an error wrapping ErrUnauthorized). Requests in flight are
// cancelled when ctx ends; Run waits for them.
func (a *Agent) Run(ctx context.Context) error {
	defer a.relay.CloseIdleConnections()
	defer a.backend.CloseIdleConnections()
	if a.cfg.Protocol == ProtocolNative {
		return a.runNative(ctx)
	}
	return a.runLongPoll(ctx)
}

// setState logs a change of connection state once, not once per attempt.
func (a *Agent) setState(state string, args ...any) {
	a.mu.Lock()
	changed := a.state != state
	a.state = state
	a.mu.Unlock()
	if changed {
		a.cfg.Logger.Info("agent "+state, append([]any{"device", a.cfg.Device}, args...)...)
	}
}

func newRelayTransport(cfg *Config) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		TLSClientConfig:       cfg.tlsConfig(),
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   2*cfg.NumPendingRequests + 32,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		WriteBufferSize:       64 << 10,
		ReadBufferSize:        64 << 10,
	}
}

func newBackendTransport(cfg *Config) *http.Transport {
	t := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // pass the backend's encoding through untouched
		ForceAttemptHTTP2:   !cfg.DisableHTTP2,
		WriteBufferSize:     64 << 10,
		ReadBufferSize:      64 << 10,
	}
	if cfg.BackendRootCAs != nil {
		t.TLSClientConfig = &tls.Config{RootCAs: cfg.BackendRootCAs, MinVersion: tls.VersionTLS12}
	}
	if cfg.BackendH2C {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return t
}
