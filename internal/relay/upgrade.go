package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/splice"
)

// An upgraded request (a websocket, SPDY: the device answered 101) is
// forwarded by the reverse proxy like any other, up to the 101. Then the
// handler takes the connection over itself rather than leave it to the
// proxy, whose copies hold a 32 KiB buffer each way and keep the
// handler's goroutine, with its deep stack, waiting for the connection's
// life: modifyResponse hijacks the user's connection, writes the 101,
// joins the two with splice.Start (copies that hold no buffer while idle,
// in two small goroutines) and returns errUpgraded, which ends the proxy's
// part and the handler. Revocation (the end of the detached context, see
// below) closes both sides.
//
// The upgraded connection outlives the handler, so the request's context
// is detached from the handler's (Config.Detach) before it is forwarded:
// the device's side of the connection, whatever carries it, stays open
// when the handler returns, and ends when the connection does, or when
// what let the user in is withdrawn (a revoked token). The handler counts
// the connection (WaitIdle) until it ends.

// errUpgraded ends the proxy's part of a request whose connection was
// taken over after a 101: there is nothing left to answer.
var errUpgraded = errors.New("relay: the connection was upgraded and handed over")

type upgradeKey struct{}

// upgrade is one upgrade request's hand-over.
type upgrade struct {
	h     *Handler
	w     *handedWriter   // the user's, to hijack; nil once hijacked
	proto string          // the protocol the user asked for
	ctx   context.Context // the forwarded request's, detached from the handler
	// release ends ctx; early, bound to the handler's context, calls it
	// when the user goes away before the switch (stopped by the switch).
	release func()
	early   func() bool
	untrack func() // ends the handler's count of the request
	taken   bool   // the connection was taken over; set in the handler's goroutine
}

// handedWriter is the user's ResponseWriter as the reverse proxy holds
// it. The proxy keeps its ResponseWriter in a closure that the forwarded
// request's context carries (its trace of 1xx answers), and what carries
// the upgraded connection's stream keeps that context for the
// connection's life; take drops the server's writer from it, so that
// the server's state for the request (its buffers, the parsed request)
// goes with the handler.
type handedWriter struct{ http.ResponseWriter }

// Unwrap lets http.ResponseController reach the server's writer.
func (w *handedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// newUpgrade prepares the hand-over of r's connection, should the device
// switch protocols, and returns the writer and the request to forward:
// w as the hand-over holds it, and r under the detached context.
func (h *Handler) newUpgrade(w http.ResponseWriter, r *http.Request, proto string, untrack func()) (*upgrade, http.ResponseWriter, *http.Request) {
	detach := h.cfg.Detach
	if detach == nil {
		detach = func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithCancel(context.WithoutCancel(ctx))
		}
	}
	ctx, release := detach(r.Context())
	u := &upgrade{h: h, w: &handedWriter{w}, proto: proto, ctx: ctx, release: release, untrack: untrack}
	u.early = context.AfterFunc(r.Context(), release)
	return u, u.w, r.WithContext(context.WithValue(ctx, upgradeKey{}, u))
}

// handlerDone is called as the handler returns: a request whose
// connection was not taken over ends here.
func (u *upgrade) handlerDone() {
	if u.taken {
		return
	}
	u.early()
	u.release()
	u.untrack()
}

// take takes the connection over after the device's 101, making the
// checks httputil.ReverseProxy makes, and returns errUpgraded; or an error
// for the proxy's ErrorHandler to answer when the switch cannot be made.
func (u *upgrade) take(resp *http.Response) error {
	got := upgradeType(resp.Header)
	switch {
	case !printable(got):
		return fmt.Errorf("the device tried to switch to the invalid protocol %q", got)
	case !strings.EqualFold(got, u.proto):
		return fmt.Errorf("the device tried to switch to protocol %q when %q was requested", got, u.proto)
	}
	back, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		return errors.New("internal error: a 101 answer whose body cannot be written")
	}
	if !u.early() {
		return context.Canceled // the user went away before the switch
	}
	user, brw, err := http.NewResponseController(u.w).Hijack()
	if err != nil {
		u.release() // the handler returns with ctx ended, as when the user is gone
		return fmt.Errorf("the user's connection cannot switch protocols: %w", err)
	}
	header := u.w.Header()
	// The server's state for the request, its buffers among it, goes
	// with the handler: nothing writes to it after the switch (the
	// proxy's error handler ignores errUpgraded).
	u.w.ResponseWriter, u.w = nil, nil
	copyHeader(header, resp.Header)
	resp.Header = header
	resp.Body = nil // so that Write writes the head alone
	err = resp.Write(brw)
	if err == nil {
		err = brw.Flush()
	}
	resp.Body = http.NoBody // the proxy closes it; back is ours now
	if err != nil {
		user.Close()
		back.Close()
		u.release()
		u.h.cfg.Logger.Debug("upgrade: writing the 101 failed", logkey.Err, err)
		return errUpgraded
	}
	u.taken = true
	if n := brw.Reader.Buffered(); n > 0 {
		// What the user sent right behind its request, read with it, goes
		// first.
		pending, _ := brw.Reader.Peek(n)
		if _, err := back.Write(pending); err != nil {
			user.Close()
			back.Close()
			u.release()
			u.untrack()
			return errUpgraded
		}
	}
	stop := context.AfterFunc(u.ctx, func() {
		user.Close()
		back.Close()
	})
	splice.Start(user, back, func(splice.Result) {
		stop()
		u.release()
		u.untrack()
	})
	return errUpgraded
}

// upgradeType returns the protocol h asks to switch to, or "".
func upgradeType(h http.Header) string {
	for _, v := range h.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return h.Get("Upgrade")
			}
		}
	}
	return ""
}

func printable(s string) bool {
	for i := range len(s) {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = append(dst[k], vv...)
	}
}
