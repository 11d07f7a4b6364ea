package procfleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"

	"github.com/switchboard-relay/switchboard/internal/agent"
)

// Agents runs Switchboard agents in this process until Stop.
type Agents struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewAgents returns a group of agents that run until ctx ends or Stop.
func NewAgents(ctx context.Context) *Agents {
	ctx, cancel := context.WithCancel(ctx)
	return &Agents{ctx: ctx, cancel: cancel}
}

// Start runs one agent of cfg; its log is discarded unless cfg names a
// logger.
func (a *Agents) Start(cfg agent.Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ag, err := agent.New(cfg)
	if err != nil {
		return fmt.Errorf("agent %s: %w", cfg.Device, err)
	}
	a.wg.Go(func() { ag.Run(a.ctx) })
	return nil
}

// Stop ends every agent and waits for them.
func (a *Agents) Stop() {
	a.cancel()
	a.wg.Wait()
}

// Rotate returns relays starting at the i-th (modulo their number): each
// agent knows every relay, first a different one, as behind a balancer.
func Rotate(relays []*url.URL, i int) []*url.URL {
	k := i % len(relays)
	return append(append([]*url.URL{}, relays[k:]...), relays[:k]...)
}

// Backend is the service behind every agent: /stream answers 20 lines of
// 7 bytes over 2 s, /ws echoes websocket messages, and any other path
// answers "ok".
type Backend struct {
	srv *http.Server
	url *url.URL
}

// StreamBytes is how many bytes /stream answers.
const StreamBytes = 20 * 7

// StartBackend serves a Backend on a loopback port until Close.
func StartBackend() (*Backend, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/stream", stream)
	mux.HandleFunc("/ws", benchkit.WebSocketEcho)
	b := &Backend{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, url: &url.URL{Scheme: "http", Host: ln.Addr().String()}}
	go b.srv.Serve(ln)
	return b, nil
}

// URL is where the backend listens, for an agent's Backend.
func (b *Backend) URL() *url.URL { return b.url }

// Close stops the backend, closing its connections.
func (b *Backend) Close() { b.srv.Close() }

func stream(w http.ResponseWriter, r *http.Request) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for i := range 20 {
		fmt.Fprintf(w, "chunk%d\n", i%10)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}
