package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/backoff"
	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// runNative keeps one tunnel to a relay open, serving every request on it,
// with a standby tunnel beside it at another relay when its relay names
// one (hold), and redials with jittered backoff when it drops and no
// standby took its place. Against a relay without the tunnel it falls
// back to the long-poll protocol.
func (a *Agent) runNative(ctx context.Context) error {
	handler := a.nativeHandler()
	var wg sync.WaitGroup // the tunnels served, standbys included
	defer wg.Wait()
	bo := backoff.New(backoff.Policy{})
	w := newWalker(a.cfg.Relays)
	for ctx.Err() == nil {
		c, extra := w.target()
		conn, placed, version, err := a.dialTunnel(ctx, c, extra)
		if re, ok := tunnel.IsRedirect(err); ok {
			if w.redirected(re) {
				a.cfg.Logger.Debug("sent to the relay that holds the device", logkey.Relay, re.Location.Redacted(), logkey.Holder, re.Holder)
				continue
			}
			err = errors.New("redirected too many times in a row")
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, tunnel.ErrRefused):
			a.setState("refused", logkey.Err, err)
			return errors.Join(ErrUnauthorized, err)
		case errors.Is(err, tunnel.ErrNotSupported):
			a.setState("falling back to long-poll", logkey.Relay, c.url.Redacted(), logkey.Reason, err)
			return a.runLongPoll(ctx)
		case err != nil:
			a.setState("disconnected", logkey.Relay, c.url.Redacted(), logkey.Err, err)
			if w.failed(c) {
				continue // another relay of the fleet's list: try it at once
			}
			if !sleep(ctx, bo.Next(time.Now())) {
				return nil
			}
			continue
		}
		bo.Up(time.Now())
		w.connected(c, placed)
		a.setState("connected", logkey.Relay, c.url.Redacted(), logkey.RelayID, placed.RelayID, logkey.Protocol, ProtocolNative, logkey.TunnelVersion, version)
		t, away := a.hold(ctx, &wg, w, a.serveTunnel(ctx, &wg, c, conn, placed, version, handler, true))
		if away && ctx.Err() == nil {
			// The relay drains: connect elsewhere now, while this
			// tunnel's streams finish beside the next one.
			a.setState("moving: the relay asked this agent to go", logkey.Relay, t.c.url.Redacted())
			continue
		}
		<-t.done // hold returns once it has ended, or with ctx
		if ctx.Err() != nil {
			return nil
		}
		silent := t.wc.silent(t.up, t.quiet(a.cfg.Liveness))
		w.lost(silent, t.wc.lastSign(t.up))
		if silent {
			// The relay stopped answering: go to the next relay at once.
			a.setState("disconnected", logkey.Relay, t.c.url.Redacted(), logkey.Err, "the relay stopped answering")
			continue
		}
		a.setState("disconnected", logkey.Relay, t.c.url.Redacted(), logkey.Err, "tunnel closed")
		if !sleep(ctx, bo.Next(time.Now())) {
			return nil
		}
	}
	return nil
}

// dialTunnel opens a tunnel to the relay c, by HTTP/1.1 Upgrade or
// WebSocket, and returns what the relay said of its place in the fleet and
// the tunnel's version. It offers the newest version it may; a relay that
// knows only version 1 refuses that offer, and it asks again at once for
// version 1 alone.
func (a *Agent) dialTunnel(ctx context.Context, c candidate, extra http.Header) (net.Conn, tunnel.Placed, int, error) {
	version := a.cfg.tunnelVersion()
	conn, placed, err := a.dialVersion(ctx, c, extra, version)
	if version == tunnel.V2 && errors.Is(err, tunnel.ErrNotSupported) && !a.cfg.WebSocket {
		a.cfg.Logger.Debug("relay lacks tunnel version 2: asking for version 1", logkey.Relay, c.url.Redacted(), logkey.Reason, err)
		version = tunnel.V1
		conn, placed, err = a.dialVersion(ctx, c, extra, version)
	}
	if err != nil {
		return nil, tunnel.Placed{}, 0, err
	}
	return conn, placed, tunnel.VersionOf(conn), nil
}

// dialVersion is dialTunnel offering version.
func (a *Agent) dialVersion(ctx context.Context, c candidate, extra http.Header, version int) (net.Conn, tunnel.Placed, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	header := http.Header{wire.InstanceHeader: {a.instance}, tunnel.PingHeader: {a.pingMs()}}
	for k, v := range extra {
		header[k] = v
	}
	relay := c.url
	if c.id == "" { // a configured entry point: the operator's prefix applies
		relay = a.prefixed(relay)
	}
	if !a.cfg.WebSocket {
		conn, err := tunnel.Dial(dctx, tunnel.DialConfig{
			Relay: relay, Device: a.cfg.Device, Token: a.cfg.Token,
			Instance: a.instance, TLS: a.cfg.tlsConfig(),
			Version: version, Services: a.announce,
		}, header)
		if err != nil {
			return nil, tunnel.Placed{}, err
		}
		return conn, tunnel.PlacedOf(conn), nil
	}
	u := *relay
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path = strings.TrimSuffix(u.Path, "/") + tunnel.WebSocketPath
	u.RawQuery = url.Values{"device": {a.cfg.Device}}.Encode()
	if a.cfg.Token != "" {
		header.Set("Authorization", "Bearer "+a.cfg.Token)
	}
	if version == tunnel.V2 {
		header.Set(tunnel.VersionHeader, tunnel.ProtocolV2)
		header.Set(tunnel.ServicesHeader, a.announce)
	}
	ws, resp, err := websocket.Dial(dctx, u.String(), &websocket.DialOptions{HTTPClient: a.wsClient, HTTPHeader: header})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusTemporaryRedirect {
			return nil, tunnel.Placed{}, tunnel.RedirectFromResponse(resp)
		}
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			return nil, tunnel.Placed{}, errors.Join(tunnel.ErrRefused, err)
		}
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, tunnel.Placed{}, errors.Join(tunnel.ErrNotSupported, err)
		}
		return nil, tunnel.Placed{}, err
	}
	conn := websocket.NetConn(context.Background(), ws, websocket.MessageBinary)
	if strings.EqualFold(resp.Header.Get(tunnel.VersionHeader), tunnel.ProtocolV2) {
		conn = tunnel.WithVersion(conn, tunnel.V2)
	}
	return conn, tunnel.PlacedFromHeader(resp.Header), nil
}

// prefixed returns relay with the relay prefix appended to its path.
func (a *Agent) prefixed(relay *url.URL) *url.URL {
	u := *relay
	u.Path = strings.TrimSuffix(u.Path, "/") + a.cfg.RelayPrefix
	return &u
}

// nativeHandler forwards the tunnel's streams to the backend.
func (a *Agent) nativeHandler() http.Handler {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			a.rewriteToBackend(pr.Out, pr.In)
		},
		Transport: a.backend.Transport,
		// No FlushInterval: ReverseProxy flushes every write of a body of
		// unknown length (chunked, gRPC, server-sent events) on its own,
		// and a body whose length is known goes out as it fills the
		// stream's buffer and at its end. Flushing every write of those
		// too cost a frame write and a hand-over to the connection's
		// writer per response for nothing: the relay's own proxy buffers
		// them the same way on the user's side.
		BufferPool: bufferPool{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the user went away
			}
			a.cfg.Logger.Warn("backend request failed", logkey.Device, a.cfg.Device, logkey.Err, err)
			http.Error(w, "Backend request failed: "+err.Error(), http.StatusBadGateway)
		},
	}
	rewrite := func(in *http.Request) *http.Request {
		out := in.Clone(in.Context())
		a.rewriteToBackend(out, in)
		out.RequestURI = ""
		return out
	}
	return tunnel.UpgradeHandler(a.backend.Transport, rewrite, proxy)
}

// rewriteToBackend points out at the backend, keeping the path and query of in.
func (a *Agent) rewriteToBackend(out, in *http.Request) {
	b := a.cfg.Backend
	out.URL.Scheme, out.URL.Host = b.Scheme, b.Host
	out.URL.Path = strings.TrimSuffix(b.Path, "/") + in.URL.Path
	if in.URL.RawPath != "" || b.RawPath != "" {
		out.URL.RawPath = strings.TrimSuffix(b.EscapedPath(), "/") + in.URL.EscapedPath()
	} else {
		out.URL.RawPath = ""
	}
	if a.cfg.PreserveHost {
		out.Host = in.Host
	} else {
		out.Host = ""
	}
	for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v := in.Header.Values(h); len(v) > 0 {
			out.Header[h] = v
		}
	}
}

// copyBuffers recycles the reverse proxy's copy buffers.
var copyBuffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// bufferPool is an httputil.BufferPool over copyBuffers.
type bufferPool struct{}

func (bufferPool) Get() []byte  { return copyBuffers.Get().(*[32 << 10]byte)[:] }
func (bufferPool) Put(b []byte) { copyBuffers.Put((*[32 << 10]byte)(b)) }
