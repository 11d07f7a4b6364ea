package connect

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
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
)

// ClientConfig says how to reach the fleet.
type ClientConfig struct {
	// Relay is the fleet's public URL: http(s)://host[:port][/prefix].
	Relay *url.URL
	// Token is a user token, sent as a bearer token; or Code, an access
	// code, sent in the URL. One of them.
	Token, Code string
	// TLS verifies https relays; nil means the system roots.
	TLS *tls.Config
	// Sign, when set, adds headers to each upgrade request: a relay that
	// forwards a user's streams to the device's holder signs with it
	// instead of sending a user's credential.
	Sign func(h http.Header)
	// Liveness: ping after PingAfter of silence, give the connection up
	// after DeadAfter. Defaults 15 s and 45 s: a user's connections are
	// few and long.
	PingAfter, DeadAfter time.Duration
}

// Client keeps one connection to the fleet and opens a stream on it per
// Dial, dialling the fleet again when the connection is lost.
type Client struct {
	cfg ClientConfig

	mu   sync.Mutex // guards sess
	sess *mux.Session
}

// NewClient returns a client; it connects at the first Dial.
func NewClient(cfg ClientConfig) *Client {
	if cfg.PingAfter <= 0 {
		cfg.PingAfter = 15 * time.Second
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = 45 * time.Second
	}
	return &Client{cfg: cfg}
}

// Dial opens a connection to target's service. A refusal (no such device
// or service, not allowed, the service refused) shows as the first read's
// error, one of this package's errors: the open costs no round trip.
func (c *Client) Dial(ctx context.Context, target Target) (net.Conn, error) {
	sess, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	st, err := sess.Open(ctx, []byte(target.String()))
	if err != nil {
		return nil, err
	}
	return &stream{Stream: st}, nil
}

// Close ends the connection to the fleet, and every stream on it.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != nil {
		return c.sess.Close()
	}
	return nil
}

func (c *Client) session(ctx context.Context) (*mux.Session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != nil && c.sess.Err() == nil {
		return c.sess, nil
	}
	conn, err := c.handshake(ctx)
	if err != nil {
		return nil, err
	}
	c.sess = mux.New(conn, mux.Config{Client: true, RefuseStreams: true, PingAfter: c.cfg.PingAfter, DeadAfter: c.cfg.DeadAfter})
	return c.sess, nil
}

// handshake dials the relay and upgrades the connection.
func (c *Client) handshake(ctx context.Context) (net.Conn, error) {
	u := *c.cfg.Relay
	u.Path = strings.TrimSuffix(u.Path, "/") + Path
	if c.cfg.Code != "" {
		u.RawQuery = url.Values{"code": {c.cfg.Code}}.Encode()
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.cfg.Relay.Redacted(), err)
	}
	if u.Scheme == "https" {
		cfg := c.cfg.TLS.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("connect to %s: %w", c.cfg.Relay.Redacted(), err)
		}
		conn = tc
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", Protocol)
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	if c.cfg.Sign != nil {
		c.cfg.Sign(req.Header)
	}
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect to %s: %w", c.cfg.Relay.Redacted(), err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect to %s: %w", c.cfg.Relay.Redacted(), err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		conn.Close()
		return nil, &HandshakeError{Status: resp.StatusCode, Message: strings.TrimSpace(string(body))}
	}
	if br.Buffered() > 0 {
		conn.Close()
		return nil, errors.New("connect: the relay spoke before the client")
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

// HandshakeError is the relay's refusal of the connection itself.
type HandshakeError struct {
	Status  int
	Message string
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("the relay refused the connection: %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

// stream reports a refused stream as one of the package's errors.
type stream struct{ *mux.Stream }

func (s *stream) Read(p []byte) (int, error) {
	n, err := s.Stream.Read(p)
	return n, errorOf(err)
}

func (s *stream) Write(p []byte) (int, error) {
	n, err := s.Stream.Write(p)
	return n, errorOf(err)
}

func (s *stream) WriteTo(w io.Writer) (int64, error) {
	n, err := s.Stream.WriteTo(w)
	return n, errorOf(err)
}

func (s *stream) ReadFrom(r io.Reader) (int64, error) {
	n, err := s.Stream.ReadFrom(r)
	return n, errorOf(err)
}
