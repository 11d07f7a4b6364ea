package connect

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/splice"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Opener opens a connection to a device's service, wherever the fleet
// holds the device. Its errors choose what the user is told (ErrNoDevice,
// ErrUnknownService, ErrRefused, ...).
type Opener interface {
	Open(ctx context.Context, target Target) (net.Conn, error)
}

// Allow checks, for one credential, whether it may reach target.
type Allow func(target Target) error

// Handler is the relay's end: it authorizes the upgrade, then joins each
// stream to the service it names.
type Handler struct {
	Open Opener
	// Authorize checks the request's credential and returns what it
	// allows, or an error whose status (see StatusOf) is answered.
	Authorize func(r *http.Request) (Allow, error)
	// PingAfter and DeadAfter set the relay's liveness checks of the
	// client, as for mux.Config. Defaults 30 s and 60 s: the client pings
	// more often, so the relay rarely needs to.
	PingAfter, DeadAfter time.Duration
	// Conns accounts for every stream carried (metrics, the log and the
	// event log, a drain's wait); nil accounts for none.
	Conns  *tcpconns.Tracker
	Logger *slog.Logger
}

// StatusError is an authorizer's refusal with its HTTP status.
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

// ServeHTTP upgrades the connection and serves its streams until it ends.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), Protocol) {
		w.Header().Set("Upgrade", Protocol)
		http.Error(w, "this endpoint speaks "+Protocol+": use switchboard connect", http.StatusUpgradeRequired)
		return
	}
	allow, err := h.Authorize(r)
	if err != nil {
		code := http.StatusUnauthorized
		var se *StatusError
		if errors.As(err, &se) {
			code = se.Code
		}
		http.Error(w, err.Error(), code)
		return
	}
	conn, ok := Hijack(w, Protocol)
	if !ok {
		return
	}
	sess := mux.New(conn, mux.Config{PingAfter: cmp.Or(h.PingAfter, 30*time.Second), DeadAfter: cmp.Or(h.DeadAfter, 60*time.Second)})
	// The request's context ends when the credential is revoked or the
	// relay stops: the session and its streams end with it.
	stop := context.AfterFunc(r.Context(), func() { sess.Close() })
	defer stop()
	h.serve(r.Context(), sess, allow, r.RemoteAddr)
}

// Hijack takes the connection of an upgrade request to protocol from w
// and answers 101 on it. It reports false when it could not, having
// answered or closed the connection.
func Hijack(w http.ResponseWriter, protocol string) (net.Conn, bool) {
	// Hijack first, then answer 101 on the connection itself: the client
	// speaks as soon as it reads the 101, and bytes that arrived before a
	// hijack would sit in net/http's buffer, the session's first frames.
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "this connection cannot be upgraded (HTTP/2?): "+protocol+" needs HTTP/1.1", http.StatusHTTPVersionNotSupported)
		return nil, false
	}
	if brw.Reader.Buffered() > 0 {
		conn.Close() // the client must wait for the 101
		return nil, false
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+protocol+"\r\n\r\n"); err != nil {
		conn.Close()
		return nil, false
	}
	return conn, true
}

// serve joins each stream of sess to its service.
func (h *Handler) serve(ctx context.Context, sess *mux.Session, allow Allow, source string) {
	defer sess.Close()
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := sess.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go h.join(ctx, st, allow, source, wg.Done)
	}
}

// join opens st's service and joins the two, calling done once they have
// ended. It returns once the joining has started: the copies wait for
// bytes in goroutines of their own (splice.Start), so that an idle
// connection holds no goroutine whose stack grew while it opened.
func (h *Handler) join(ctx context.Context, st *mux.Stream, allow Allow, source string, done func()) {
	name := string(st.Meta())
	target, err := parseMeta(name)
	if err == nil {
		err = allow(target)
	}
	var conn net.Conn
	if err == nil {
		conn, err = h.Open.Open(ctx, target)
	}
	if err != nil {
		h.refuse(target, name, source, err)
		st.Reset(codeOf(err))
		done()
		return
	}
	if h.Conns == nil {
		splice.Start(st, &refusable{Conn: conn, st: st}, func(splice.Result) { done() })
		return
	}
	tc := h.Conns.Open(target.kind(), target.Service, name, source, func() {
		st.Reset(mux.CodeCancel)
		conn.Close()
	})
	splice.Start(st, &refusable{Conn: conn, st: st}, func(res splice.Result) {
		defer done()
		if reason := Reason(res.Err); reason != "" && res.BToA == 0 {
			tc.Refused(reason, res.Err)
			return
		}
		tc.Close(res.AToB, res.BToA)
	})
}

// refuse accounts for a stream refused before its open: the service's
// name labels the refusal only when the device was found to have it.
func (h *Handler) refuse(target Target, name, source string, err error) {
	if h.Conns == nil {
		h.logger().Info("connection refused", logkey.Target, name, logkey.Source, source, logkey.Err, err)
		return
	}
	reason := Reason(err)
	switch {
	case target.Device == "":
		reason = tcpconns.ReasonBadTarget
	case reason == "":
		reason = tcpconns.ReasonUnreachable // as codeOf tells the user
	}
	svc := target.Service
	if reason == tcpconns.ReasonUnknownService || reason == tcpconns.ReasonBadTarget || reason == tcpconns.ReasonForbidden {
		svc = ""
	}
	h.Conns.Refuse(target.kind(), svc, name, source, reason, err)
}

// refusable is the service's side of a stream: a refusal it reports only
// once used (an open without a round trip, through an agent or another
// relay) resets the user's stream with the refusal's code, so that the
// user is told why, not merely that the stream ended.
type refusable struct {
	net.Conn
	st *mux.Stream
}

func (c *refusable) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.check(err)
	return n, err
}

func (c *refusable) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.check(err)
	return n, err
}

// WriteTo writes what the service sends to w through the copy of what
// carries it (a tunnel's stream: see mux.Carrier), checking its end as
// Read does.
func (c *refusable) WriteTo(w io.Writer) (int64, error) {
	n, err := mux.Copy(w, c.Conn)
	c.check(err)
	return n, err
}

// WriteStep is WriteTo's copy in steps (see mux.StepWriterTo), so that a
// copy from an idle service waits on a small stack.
func (c *refusable) WriteStep(w io.Writer) func() (int, error) {
	check := func(err error) error {
		c.check(err)
		return err
	}
	return mux.StepsThrough(w, c.Conn, func() (int64, error) { return c.WriteTo(w) }, check)
}

// CarriedStream returns the stream the service's side is, if it is one:
// Write changes nothing of what it writes.
func (c *refusable) CarriedStream() *mux.Stream {
	if cr, ok := c.Conn.(mux.Carrier); ok {
		return cr.CarriedStream()
	}
	return nil
}

// CloseWrite half-closes the service's side, when it can.
func (c *refusable) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

func (c *refusable) check(err error) {
	if err == nil {
		return
	}
	for _, k := range codes {
		if errors.Is(err, k.err) {
			c.st.Reset(k.code)
			return
		}
	}
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Logger
}
