package connect

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/splice"

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
	Logger               *slog.Logger
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
	rc := http.NewResponseController(w)
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", Protocol)
	w.WriteHeader(http.StatusSwitchingProtocols)
	if err := rc.Flush(); err != nil {
		return
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		return
	}
	if brw.Reader.Buffered() > 0 {
		conn.Close() // the client must wait for the 101
		return
	}
	sess := mux.New(conn, mux.Config{PingAfter: cmp.Or(h.PingAfter, 30*time.Second), DeadAfter: cmp.Or(h.DeadAfter, 60*time.Second)})
	h.serve(r.Context(), sess, allow)
}

// serve joins each stream of sess to its service.
func (h *Handler) serve(ctx context.Context, sess *mux.Session, allow Allow) {
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
		wg.Go(func() { h.join(ctx, st, allow) })
	}
}

func (h *Handler) join(ctx context.Context, st *mux.Stream, allow Allow) {
	target, err := ParseTarget(string(st.Meta()))
	if err == nil {
		err = allow(target)
	}
	var conn net.Conn
	if err == nil {
		conn, err = h.Open.Open(ctx, target)
	}
	if err != nil {
		h.logger().Info("connection refused", logkey.Target, string(st.Meta()), logkey.Err, err)
		st.Reset(codeOf(err))
		return
	}
	splice.Join(st, conn)
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Logger
}
