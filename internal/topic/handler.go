package topic

import (
	"context"
	"errors"
	"fmt"
	"github.com/switchboard-relay/switchboard/internal/wire"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/auth"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Prefix is the path under which the public listener serves topics:
// /topic/<device>/<name>.
const Prefix = "/topic/"

// BroadcastHeader marks a device's answer to a GET as a stream every
// viewer shares (an agent's --broadcast-path): the relay fetches it once
// and fans it out. The relay removes it before the answer reaches a user.
const BroadcastHeader = wire.BroadcastHeader

// MaxNameLen bounds a topic's name.
const MaxNameLen = 64

// ModeParam is the query parameter that says what a connection does.
const ModeParam = "mode"

// Mode is what a connection to a topic does: read, write or both.
type Mode uint8

// The modes.
const (
	Read      Mode = 1 << iota // receives every message published after it joined
	Write                      // publishes messages
	ReadWrite = Read | Write
)

func (m Mode) String() string {
	switch m {
	case Read:
		return "read"
	case Write:
		return "write"
	case ReadWrite:
		return "readwrite"
	default:
		return fmt.Sprintf("Mode(%d)", uint8(m))
	}
}

// RequestError is bad input, answered with its status before any upgrade.
type RequestError struct {
	Status int
	Msg    string
}

func (e *RequestError) Error() string   { return e.Msg }
func (e *RequestError) HTTPStatus() int { return e.Status }

// ParseMode reads the mode parameter: "read" (or absent), "write" or
// "readwrite".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "read":
		return Read, nil
	case "write":
		return Write, nil
	case "readwrite":
		return ReadWrite, nil
	}
	return 0, &RequestError{http.StatusBadRequest, fmt.Sprintf("mode %q is none of read, write, readwrite", s)}
}

// ParsePath reads the topic of a path /topic/<device>/<name>.
func ParsePath(p string) (Key, error) {
	rest, ok := strings.CutPrefix(p, Prefix)
	device, name, two := strings.Cut(rest, "/")
	if !ok || !two || strings.Contains(name, "/") {
		return Key{}, &RequestError{http.StatusNotFound, "a topic is at /topic/<device>/<name>"}
	}
	if err := auth.ValidateDeviceName(device); err != nil {
		return Key{}, &RequestError{http.StatusBadRequest, err.Error()}
	}
	if err := ValidateName(name); err != nil {
		return Key{}, err
	}
	return Key{Device: device, Name: name}, nil
}

// ValidateName checks a topic name: 1 to MaxNameLen letters, digits, '.',
// '_' or '-', not starting with '.'.
func ValidateName(name string) error {
	bad := name == "" || len(name) > MaxNameLen || name[0] == '.'
	for i := 0; i < len(name) && !bad; i++ {
		c := name[i]
		bad = !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-')
	}
	if bad {
		return &RequestError{http.StatusBadRequest, fmt.Sprintf("topic name %q: use 1 to %d letters, digits, '.', '_' or '-', not starting with '.'", name, MaxNameLen)}
	}
	return nil
}

// Access is what Authorize found of a connection.
type Access struct {
	// Peer marks another relay's connection (a signed forward): it is
	// served here and never passed on.
	Peer bool
}

// Authorizer decides whether the request r may open key in mode. Its
// error carries the HTTP status (401, 403, 429) through an HTTPStatus()
// int method. It returns the request to go on with.
type Authorizer func(r *http.Request, key Key, mode Mode) (*http.Request, Access, error)

// Handler serves topics as websockets. Each websocket message is one
// topic message, delivered whole, in order, as text or binary as written.
type Handler struct {
	Hub       *Hub
	Authorize Authorizer   // required
	Logger    *slog.Logger // receives a line per connection ended; nil discards
}

// Errors that end a connection.
var (
	errReadOnly   = errors.New("this connection may only read the topic: open it with ?mode=write or ?mode=readwrite to publish")
	errHolderGone = errors.New("the relay holding the device closed the topic; reconnect")
	errClientGone = errors.New("the client closed the connection")
)

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, err := ParsePath(r.URL.Path)
	if err != nil {
		httpError(w, err)
		return
	}
	mode, err := ParseMode(r.URL.Query().Get(ModeParam))
	if err != nil {
		httpError(w, err)
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Upgrade", "websocket")
		httpError(w, &RequestError{http.StatusUpgradeRequired, "a topic is read and written over a websocket"})
		return
	}
	r, acc, err := h.Authorize(r, key, mode)
	if err != nil {
		httpError(w, err)
		return
	}
	var sender Sender
	if mode&Write != 0 && !acc.Peer && h.Hub.cfg.Link != nil {
		sender, err = h.Hub.cfg.Link.Publish(r.Context(), key)
		switch {
		case errors.Is(err, ErrLocal):
		case err != nil:
			httpError(w, &RequestError{http.StatusBadGateway, fmt.Sprintf("the relay holding device %q cannot take the topic now: %v", key.Device, err)})
			return
		default:
			defer sender.Close()
		}
	}
	// Every credential here is presented per connection (a token, or an
	// access code in the URL), never ambiently as a cookie is, so another
	// site's page cannot use one the browser holds: the Origin check that
	// guards against that is not needed, and would refuse the pages of an
	// operator's own access site.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled, InsecureSkipVerify: true})
	if err != nil {
		return // Accept has answered
	}
	c.SetReadLimit(int64(h.Hub.cfg.MaxMessageBytes))
	h.serve(r.Context(), c, key, mode, acc, sender)
}

// serve runs one connection until the client, the hub, the holder or ctx
// (a revocation, the relay stopping) ends it.
func (h *Handler) serve(ctx context.Context, c *websocket.Conn, key Key, mode Mode, acc Access, sender Sender) {
	var rd *Reader
	if mode&Read != 0 {
		var err error
		if rd, err = h.Hub.Join(key, acc.Peer); err != nil {
			closeWith(c, err)
			return
		}
		defer rd.Leave()
	}
	// A writer that forwards to the holder is filed here too, so that a
	// cancel or a stop here ends it.
	var wr *Writer
	var ended <-chan struct{}
	if mode&Write != 0 {
		var err error
		if wr, err = h.Hub.Write(key); err != nil {
			closeWith(c, err)
			return
		}
		defer wr.Leave()
		ended = wr.Done()
	}
	end, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	wg.Go(func() { stop(h.readLoop(ctx, c, mode, wr, sender)) })
	if rd != nil {
		wg.Go(func() { stop(h.deliver(ctx, end, c, rd)) })
	}
	var holderGone <-chan struct{}
	if sender != nil {
		holderGone = sender.Done()
	}
	select {
	case <-end.Done():
	case <-ended:
		stop(wr.Err())
	case <-holderGone:
		stop(sender.Err())
	}
	cause := context.Cause(end)
	closeWith(c, cause)
	wg.Wait()
	if h.Logger != nil {
		h.Logger.Debug("topic connection ended", logkey.Device, key.Device, logkey.Topic, key.Name, logkey.Mode, mode.String(), logkey.Peer, acc.Peer, logkey.Cause, cause)
	}
}

// readLoop takes the client's messages: a writer's are published (here or
// at the holder, waiting while the holder's link is full); a reader may
// send none.
func (h *Handler) readLoop(ctx context.Context, c *websocket.Conn, mode Mode, wr *Writer, sender Sender) error {
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != -1 {
				return errClientGone
			}
			return err
		}
		if mode&Write == 0 {
			return errReadOnly
		}
		m := Message{Binary: typ == websocket.MessageBinary, Data: data}
		if sender == nil {
			wr.Publish(m)
			continue
		}
		if err := sender.Send(ctx, m); err != nil {
			return fmt.Errorf("%w: %v", errHolderGone, err)
		}
	}
}

// deliver writes the reader's queue to the client until end ends. A write
// that takes longer than MaxLag cuts the reader.
func (h *Handler) deliver(ctx, end context.Context, c *websocket.Conn, rd *Reader) error {
	lag := h.Hub.cfg.MaxLag
	var batch []Message
	for {
		var err error
		if batch, err = rd.Next(end, batch); err != nil {
			return err
		}
		for _, m := range batch {
			wctx, cancel := ctx, context.CancelFunc(func() {})
			if lag > 0 {
				wctx, cancel = context.WithTimeout(ctx, lag)
			}
			typ := websocket.MessageText
			if m.Binary {
				typ = websocket.MessageBinary
			}
			err := c.Write(wctx, typ, m.Data)
			timedOut := wctx.Err() != nil && ctx.Err() == nil
			cancel()
			if err != nil {
				if timedOut {
					return rd.Lagged()
				}
				return err
			}
			rd.Delivered(m)
		}
		clear(batch) // let the messages go
	}
}

// closeWith closes c with the status and reason that say why.
func closeWith(c *websocket.Conn, cause error) {
	code := websocket.StatusInternalError
	switch {
	case cause == nil, errors.Is(cause, errClientGone):
		code = websocket.StatusNormalClosure
	case errors.Is(cause, ErrLagging):
		code = websocket.StatusTryAgainLater
	case errors.Is(cause, ErrClosed), errors.Is(cause, ErrMoved), errors.Is(cause, errHolderGone):
		code = websocket.StatusServiceRestart
	case errors.Is(cause, ErrCancelled), errors.Is(cause, auth.ErrRevoked), errors.Is(cause, errReadOnly):
		code = websocket.StatusPolicyViolation
	}
	reason := ""
	if cause != nil && code != websocket.StatusNormalClosure {
		reason = cause.Error()
	}
	if len(reason) > 120 { // a close frame's reason holds 123 bytes
		reason = reason[:120]
	}
	c.Close(code, reason)
}

func httpError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	var se interface{ HTTPStatus() int }
	if errors.As(err, &se) {
		status = se.HTTPStatus()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	fmt.Fprintln(w, err.Error())
}
