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
	// Path and Protocol name the endpoint and the upgrade: another
	// protocol over the same kind of session (package forward's) sets
	// them. Defaults Path and Protocol.
	Path, Protocol string
	// Accept, when set, is handed each stream the relay opens, on a
	// goroutine of the client that Close waits for; it must return soon.
	// Nil refuses them.
	Accept func(*mux.Stream)
}

// Client keeps one connection to the fleet and opens a stream on it per
// Dial, dialling the fleet again when the connection is lost.
type Client struct {
	cfg      ClientConfig
	acceptor sync.WaitGroup // the goroutines that hand Accept the relay's streams

	mu      sync.Mutex // guards the fields below
	sess    *mux.Session
	retired map[*mux.Session]struct{} // sessions that take no new stream, until their streams end
}

// NewClient returns a client; it connects at the first Dial.
func NewClient(cfg ClientConfig) *Client {
	if cfg.PingAfter <= 0 {
		cfg.PingAfter = 15 * time.Second
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = 45 * time.Second
	}
	if cfg.Path == "" {
		cfg.Path = Path
	}
	if cfg.Protocol == "" {
		cfg.Protocol = Protocol
	}
	return &Client{cfg: cfg}
}

// Dial opens a connection to target's service. A refusal (no such device
// or service, not allowed, the service refused) shows as the first read's
// error, one of this package's errors: the open costs no round trip.
func (c *Client) Dial(ctx context.Context, target Target) (net.Conn, error) {
	st, err := c.Open(ctx, []byte(target.meta()))
	if err != nil {
		return nil, err
	}
	return &stream{Stream: st}, nil
}

// Open opens a stream whose metadata is meta on the connection, dialling
// the relay first when there is none. An error from the dial or the
// handshake (a *HandshakeError: the relay refused the upgrade) means no
// stream was opened.
func (c *Client) Open(ctx context.Context, meta []byte) (*mux.Stream, error) {
	for range 2 {
		sess, err := c.session(ctx)
		if err != nil {
			return nil, err
		}
		st, err := sess.Open(ctx, meta)
		if errors.Is(err, mux.ErrStreamsExhausted) || errors.Is(err, mux.ErrGoAway) {
			c.retire(sess) // a new session for this stream and the next
			continue
		}
		return st, err
	}
	return nil, &mux.OpenError{Err: mux.ErrGoAway}
}

// retire stops opening streams on sess, which takes no more, and closes it
// once its streams have ended.
func (c *Client) retire(sess *mux.Session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != sess {
		return
	}
	c.sess = nil
	if c.retired == nil {
		c.retired = map[*mux.Session]struct{}{}
	}
	c.retired[sess] = struct{}{}
	c.acceptor.Go(func() {
		defer func() {
			c.mu.Lock()
			delete(c.retired, sess)
			c.mu.Unlock()
		}()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for sess.NumStreams() > 0 {
			select {
			case <-sess.Done():
				return
			case <-tick.C:
			}
		}
		sess.Close()
	})
}

// Close ends the connection to the fleet, and every stream on it.
func (c *Client) Close() error {
	c.mu.Lock()
	var err error
	if c.sess != nil {
		err = c.sess.Close()
	}
	for sess := range c.retired {
		sess.Close()
	}
	c.mu.Unlock()
	c.acceptor.Wait()
	return err
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
	sess := mux.New(conn, mux.Config{Client: true, RefuseStreams: c.cfg.Accept == nil, PingAfter: c.cfg.PingAfter, DeadAfter: c.cfg.DeadAfter})
	if c.cfg.Accept != nil {
		c.acceptor.Go(func() {
			for {
				st, err := sess.Accept()
				if err != nil {
					return
				}
				c.cfg.Accept(st)
			}
		})
	}
	c.sess = sess
	return sess, nil
}

// handshake dials the relay and upgrades the connection.
func (c *Client) handshake(ctx context.Context) (net.Conn, error) {
	u := *c.cfg.Relay
	u.Path = strings.TrimSuffix(u.Path, "/") + c.cfg.Path
	if c.cfg.Code != "" {
		u.RawQuery = url.Values{"code": {c.cfg.Code}}.Encode()
	}
	h := http.Header{}
	if c.cfg.Token != "" {
		h.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	if c.cfg.Sign != nil {
		c.cfg.Sign(h)
	}
	return DialUpgrade(ctx, &u, c.cfg.TLS, c.cfg.Protocol, h)
}

// DialUpgrade dials the endpoint u (http:// or https://, verified with
// tlsConf, nil for the system roots), sends it an HTTP/1.1 request to
// switch to protocol with the headers in h, and returns the connection
// once it answered 101. An endpoint that answers otherwise is a
// *HandshakeError. Errors name u without its query (an access code).
func DialUpgrade(ctx context.Context, u *url.URL, tlsConf *tls.Config, protocol string, h http.Header) (net.Conn, error) {
	named := *u
	named.RawQuery = ""
	where := named.Redacted()
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
		return nil, fmt.Errorf("connect to %s: %w", where, err)
	}
	if u.Scheme == "https" {
		cfg := tlsConf.Clone()
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
			return nil, fmt.Errorf("connect to %s: %w", where, err)
		}
		conn = tc
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", protocol)
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect to %s: %w", where, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect to %s: %w", where, err)
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
