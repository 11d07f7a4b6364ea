// Package tunnel is Switchboard's native agent protocol: one persistent
// connection per agent, opened by the agent with an HTTP/1.1 Upgrade (or a
// WebSocket for paths that pass nothing else), then carrying HTTP/2 with the
// roles reversed — the relay is the HTTP/2 client, the agent the server — so
// that every user request is its own stream with flow control, trailers,
// streaming both ways and cancellation from a mature implementation
// (golang.org/x/net/http2). A 101 upgrade, which HTTP/2 cannot carry, travels
// as a marked stream whose request and response bodies are the two directions
// of the raw byte stream.
//
// Version 2 (switchboard-tunnel/2, see docs/design/tunnel-v2.md) replaces
// HTTP/2 by the streams of package mux: the relay opens a stream naming one
// of the services the agent announced in its handshake, the agent dials it
// and copies bytes (ServeStreams), and the relay speaks HTTP over the
// stream with net/http's client, pooled with keep-alive. The handshake is
// versioned: relays take both versions, and an agent falls back to version
// 1 against a relay that knows only it.
//
// This package holds both ends: the handshake (Dial for agents, Accept for
// relays), the relay's sessions and pool, and the agent's serving loops.
package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
)

// Protocol names the first version of the tunnel (HTTP/2 with reversed
// roles) in the Upgrade header.
const Protocol = "switchboard-tunnel/1"

// ProtocolV2 names the tunnel's second version: the relay opens streams of
// package mux to the services the agent announced (ServicesHeader), and
// the agent dials them and copies bytes. An agent offers both versions,
// newest first ("Upgrade: switchboard-tunnel/2, switchboard-tunnel/1"); a
// relay answers 101 with the one it chose. A relay that knows only the
// first version refuses that offer with 400, and the agent asks again for
// version 1 alone.
const ProtocolV2 = "switchboard-tunnel/2"

// ProtocolStandby names, in the Upgrade header, a standby tunnel: a
// version 2 session that the relay keeps beside the device's tunnel on
// another relay, without taking the device or any request, until it
// promotes it (see docs/design/hot-standby.md). A relay from before hot
// standby does not know the token and refuses the offer, so it never
// takes a standby for a tunnel.
const ProtocolStandby = "switchboard-standby/2"

// Tunnel versions, as Version reports them.
const (
	V1 = 1
	V2 = 2
)

// ServicesHeader carries, in a version 2 handshake, the agent's services
// as service.Announce encodes them.
const ServicesHeader = "X-Switchboard-Services"

// VersionHeader offers, in a WebSocket handshake, the second version (its
// value is ProtocolV2); the relay that takes it answers with the same
// header. A relay that answers without it speaks version 1.
const VersionHeader = "X-Switchboard-Tunnel"

// Path is the relay endpoint an agent opens its tunnel on.
const Path = "/switchboard/tunnel"

// ErrNotSupported means the relay does not offer the native tunnel (it
// answered the handshake without switching protocols); the agent falls back
// to the long-poll protocol.
var ErrNotSupported = errors.New("relay does not offer the native tunnel")

// ErrRefused means the relay refused the agent's credential or device (401/403).
var ErrRefused = errors.New("relay refused the agent")

// DialConfig says how an agent reaches a relay.
type DialConfig struct {
	Relay    *url.URL    // http(s)://host[:port][/prefix]
	Device   string      // the device name to serve
	Token    string      // bearer token; empty for anonymous agents
	Instance string      // the agent process's id, sent as wire.InstanceHeader
	TLS      *tls.Config // for https relays; nil = defaults
	Dialer   net.Dialer
	// Version is the newest version to offer: V2 offers both, V1 (or
	// zero) only the first. Services is the announcement sent with a V2
	// offer (service.Announce).
	Version  int
	Services string
	// Standby offers a standby tunnel (ProtocolStandby) instead of a
	// tunnel; Version is then V2.
	Standby bool
}

// Dial opens a tunnel connection: a TCP (or TLS) connection upgraded to the
// tunnel protocol. The returned conn is ready to carry HTTP/2 with the agent
// as the server.
func Dial(ctx context.Context, cfg DialConfig, header http.Header) (net.Conn, error) {
	conn, err := dialRelay(ctx, cfg)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	c, err := handshake(conn, cfg, header)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return c, nil
}

func dialRelay(ctx context.Context, cfg DialConfig) (net.Conn, error) {
	host := cfg.Relay.Host
	if cfg.Relay.Port() == "" {
		if cfg.Relay.Scheme == "https" {
			host = net.JoinHostPort(cfg.Relay.Hostname(), "443")
		} else {
			host = net.JoinHostPort(cfg.Relay.Hostname(), "80")
		}
	}
	conn, err := cfg.Dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, fmt.Errorf("dial relay: %w", err)
	}
	if cfg.Relay.Scheme != "https" {
		return conn, nil
	}
	tc := cfg.TLS.Clone()
	if tc == nil {
		tc = &tls.Config{}
	}
	if tc.ServerName == "" {
		tc.ServerName = cfg.Relay.Hostname()
	}
	tc.NextProtos = []string{"http/1.1"} // the upgrade needs HTTP/1.1
	t := tls.Client(conn, tc)
	if err := t.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("TLS handshake with relay: %w", err)
	}
	return t, nil
}

// handshake sends the upgrade request on conn and reads the answer.
func handshake(conn net.Conn, cfg DialConfig, header http.Header) (net.Conn, error) {
	u := *cfg.Relay
	u.Path = strings.TrimSuffix(u.Path, "/") + Path
	u.RawQuery = url.Values{"device": {cfg.Device}}.Encode()
	req := &http.Request{
		Method:     http.MethodGet,
		URL:        &u,
		Host:       cfg.Relay.Host,
		Header:     header.Clone(),
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
	}
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", Protocol)
	if cfg.Version >= V2 {
		req.Header.Set("Upgrade", ProtocolV2+", "+Protocol)
		req.Header.Set(ServicesHeader, cfg.Services)
	}
	if cfg.Standby {
		req.Header.Set("Upgrade", ProtocolStandby)
		req.Header.Set(ServicesHeader, cfg.Services)
	}
	if cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.Token)
	}
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("send tunnel handshake: %w", err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("read tunnel handshake: %w", err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		switch got := resp.Header.Get("Upgrade"); {
		case cfg.Standby:
			if strings.EqualFold(got, ProtocolStandby) {
				return &placedConn{Conn: withBuffered(conn, br), placed: placedFrom(resp.Header), version: V2}, nil
			}
		case strings.EqualFold(got, Protocol):
			return &placedConn{Conn: withBuffered(conn, br), placed: placedFrom(resp.Header), version: V1}, nil
		case strings.EqualFold(got, ProtocolV2) && cfg.Version >= V2:
			return &placedConn{Conn: withBuffered(conn, br), placed: placedFrom(resp.Header), version: V2}, nil
		}
	}
	if resp.StatusCode == http.StatusTemporaryRedirect && !cfg.Standby {
		resp.Body.Close()
		return nil, redirectFrom(resp)
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	detail := fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, fmt.Errorf("%w: %s", ErrRefused, detail)
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusBadRequest, http.StatusNotImplemented, http.StatusSwitchingProtocols:
		return nil, fmt.Errorf("%w: %s", ErrNotSupported, detail)
	case http.StatusTemporaryRedirect: // a standby offer to a relay from before hot standby
		return nil, fmt.Errorf("%w: %s", ErrNotSupported, detail)
	default:
		return nil, fmt.Errorf("tunnel handshake: %s", detail)
	}
}

// IsHandshake reports whether r asks to open a tunnel, of either version.
func IsHandshake(r *http.Request) bool {
	return r.Method == http.MethodGet && Offered(r) != 0 && headerHasToken(r.Header, "Connection", "upgrade")
}

// Offered returns the newest tunnel version r's Upgrade header offers, or
// 0 when it offers none.
func Offered(r *http.Request) int {
	switch {
	case headerHasToken(r.Header, "Upgrade", ProtocolV2):
		return V2
	case headerHasToken(r.Header, "Upgrade", Protocol):
		return V1
	}
	return 0
}

// OffersStandby reports whether r opens a standby tunnel.
func OffersStandby(r *http.Request) bool {
	return r.Method == http.MethodGet && headerHasToken(r.Header, "Upgrade", ProtocolStandby) && headerHasToken(r.Header, "Connection", "upgrade")
}

// standbyVersion is the pseudo-version acceptVersion answers a standby
// offer with: a version 2 session under ProtocolStandby.
const standbyVersion = -V2

// protocolName returns the Upgrade token of version v.
func protocolName(v int) string {
	if v == standbyVersion {
		return ProtocolStandby
	}
	if v == V2 {
		return ProtocolV2
	}
	return Protocol
}

// Accept completes a tunnel handshake on the relay side: it answers 101 and
// takes over the connection, which is then ready to carry HTTP/2 with the
// relay as the client. The caller has checked IsHandshake and authorized the
// agent.
func Accept(w http.ResponseWriter, r *http.Request) (net.Conn, error) {
	return AcceptPlaced(w, r, Placement{})
}

// AcceptPlaced is Accept with the relay's id and the fleet's relay list in
// the answer, for version 1.
func AcceptPlaced(w http.ResponseWriter, r *http.Request, p Placement) (net.Conn, error) {
	return acceptVersion(w, p, V1)
}

// acceptVersion answers 101 for tunnel version v.
func acceptVersion(w http.ResponseWriter, p Placement, v int) (net.Conn, error) {
	extra := ""
	if p.RelayID != "" {
		extra += RelayIDHeader + ": " + p.RelayID + "\r\n"
	}
	if list := FormatRelays(p.Relays); list != "" {
		extra += RelaysHeader + ": " + list + "\r\n"
	}
	if p.Standby != "" && validHeaderToken(p.Standby) {
		extra += StandbyHeader + ": " + p.Standby + "\r\n"
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, fmt.Errorf("take over tunnel connection: %w", err)
	}
	conn.SetDeadline(time.Time{}) // the server's header deadlines do not apply to the tunnel
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+protocolName(v)+"\r\n"+extra+"\r\n"); err != nil {
		conn.Close()
		return nil, fmt.Errorf("answer tunnel handshake: %w", err)
	}
	return withBuffered(conn, brw.Reader), nil
}

// withBuffered returns conn, reading first what br has buffered from it.
func withBuffered(conn net.Conn, br *bufio.Reader) net.Conn {
	if br.Buffered() == 0 {
		return conn
	}
	data, _ := br.Peek(br.Buffered())
	return &prefixConn{Conn: conn, prefix: append([]byte(nil), data...)}
}

// placedConn is a tunnel connection with what the relay said of itself.
type placedConn struct {
	net.Conn
	placed  Placed
	version int
}

// placedConn only carries what the relay said: a session over it reads
// and writes the connection beneath (see mux.Transparent).
var _ mux.Transparent = (*placedConn)(nil)

func (c *placedConn) Wrapped() net.Conn  { return c.Conn }
func (c *placedConn) SawRead(int, error) {}

// WithVersion marks conn, a tunnel opened some other way (a WebSocket), as
// speaking version v.
func WithVersion(conn net.Conn, v int) net.Conn {
	if pc, ok := conn.(*placedConn); ok {
		pc.version = v
		return pc
	}
	return &placedConn{Conn: conn, version: v}
}

// VersionOf returns the tunnel version a dialled conn speaks: V1 for a
// connection that is not a dialled tunnel.
func VersionOf(conn net.Conn) int {
	if pc, ok := conn.(*placedConn); ok && pc.version != 0 {
		return pc.version
	}
	return V1
}

// PlacedOf returns what the relay said when it took the tunnel conn (the
// zero Placed for a connection that is not a dialled tunnel).
func PlacedOf(conn net.Conn) Placed {
	if pc, ok := conn.(*placedConn); ok {
		return pc.placed
	}
	return Placed{}
}

// prefixConn is a net.Conn whose first reads return prefix.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
