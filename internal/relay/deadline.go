package relay

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// GuardIdle returns next cut off from a client that stalls: when the
// handler waits to read the request body or to write the response and no
// byte has moved in either direction for timeout, the waiting read or write
// fails, through the deadlines of http.ResponseController (HTTP/1.1 and
// HTTP/2 alike).
//
// Only waiting on the client counts. A handler that waits for its device
// (a backend thinking, a quiet log follow, a gRPC stream between messages)
// is not cut, and a stream that keeps moving in either direction lives as
// long as it moves. A waiting body read counts only until the response
// begins: after that, the body of a full-duplex stream (a gRPC
// bidirectional call) may rest as long as its client likes, and only a
// response the client does not take is cut. A write is progress when it
// returns, so a client reading slower than one 32 KiB copy buffer per
// timeout is cut too.
//
// A request body cut before the response began is answered 408 with a
// sentence saying why (and, on HTTP/1.1, the connection closed, as the rest
// of the body is still on it); a cut after the response began, or of a
// response the client does not read, ends the stream (HTTP/2 RST_STREAM) or
// the connection (HTTP/1.1): no status can reach the client any more. The
// handler's request context ends either way, so the device's request is
// cancelled too.
//
// A handler that answers without reading the body it was sent (a request
// refused before it is forwarded) leaves the rest of the body to net/http,
// which reads it away before the next request on the connection: the guard
// bounds that by timeout too, where net/http alone waits for as long as the
// client trickles.
//
// Upgrades (websockets) and CONNECT pass unguarded: their connections are
// handed over, and deadlines on them would outlive the handler. A timeout
// ≤ 0 turns the guard off.
func GuardIdle(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w, r, unguard := guardIdle(w, r, timeout)
		defer unguard()
		next.ServeHTTP(w, r)
	})
}

// guardIdle puts w and r under GuardIdle's rules until unguard is called,
// when the handler returns.
func guardIdle(w http.ResponseWriter, r *http.Request, timeout time.Duration) (_ http.ResponseWriter, _ *http.Request, unguard func()) {
	if timeout <= 0 || r.Method == http.MethodConnect ||
		r.Header.Get("Upgrade") != "" && !strings.EqualFold(r.Header.Get("Upgrade"), "h2c") {
		return w, r, func() {}
	}
	g := &idleGuard{timeout: timeout, rc: http.NewResponseController(w), start: time.Now(), http1: r.ProtoMajor == 1}
	g.w = &idleWriter{ResponseWriter: w, g: g}
	if r.Body != nil && r.Body != http.NoBody {
		g.body = &idleBody{ReadCloser: r.Body, g: g}
		r2 := *r // a shallow copy, as http.Request.WithContext makes
		r2.Body = g.body
		r = &r2
	}
	g.mu.Lock()
	g.timer = time.AfterFunc(timeout, g.check)
	g.mu.Unlock()
	return g.w, r, g.finish
}

// aLongTimeAgo is a deadline in the past: it fails a waiting read or write
// at once.
var aLongTimeAgo = time.Unix(1, 0)

// idleGuard watches one request's reads and writes. Reads and writes only
// touch atomics; one timer per request checks them about once a timeout.
type idleGuard struct {
	timeout time.Duration
	rc      *http.ResponseController // of the server's own ResponseWriter
	start   time.Time
	http1   bool // HTTP/1.x: one request at a time on the connection
	w       *idleWriter
	body    *idleBody // nil without a request body

	// last is when, since start, the last byte moved either way, or a wait
	// began while nothing was waiting.
	last      atomic.Int64
	reading   atomic.Int32 // body reads in progress
	writing   atomic.Int32 // response writes and flushes in progress
	responded atomic.Bool  // the response's header went out
	readCut   atomic.Bool  // a waiting body read was failed

	mu       sync.Mutex // guards the fields below
	timer    *time.Timer
	done     bool // the handler returned: the timer must not touch the connection
	writeCut bool
}

func (g *idleGuard) now() int64 { return int64(time.Since(g.start)) }

// waiting reports whether the handler waits on the client: to read the
// body before the response began, or to write.
func (g *idleGuard) waiting() (reading, writing bool) {
	return g.reading.Load() > 0 && !g.responded.Load(), g.writing.Load() > 0
}

// begin marks a read or write that may wait on the client.
func (g *idleGuard) begin(ops *atomic.Int32) {
	if reading, writing := g.waiting(); !reading && !writing {
		g.last.Store(g.now()) // the clock starts with the wait
	}
	ops.Add(1)
}

// end marks the end of a read or write, which moved bytes or not.
func (g *idleGuard) end(ops *atomic.Int32, moved bool) {
	if moved {
		g.last.Store(g.now())
	}
	ops.Add(-1)
}

// check runs on the timer: it cuts what waits when nothing has moved for
// the timeout, and otherwise sets the timer for when that could be.
func (g *idleGuard) check() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return
	}
	reading, writing := g.waiting()
	idle := time.Duration(g.now() - g.last.Load())
	switch {
	case !reading && !writing:
		g.timer.Reset(g.timeout)
	case idle < g.timeout:
		g.timer.Reset(g.timeout - idle)
	default:
		if writing {
			g.writeCut = true
			g.rc.SetWriteDeadline(aLongTimeAgo)
		}
		if !g.readCut.Swap(true) {
			// Stuck writes make the body useless as well.
			g.rc.SetReadDeadline(aLongTimeAgo)
		}
		if !g.writeCut {
			g.timer.Reset(g.timeout) // the response may still stall
		}
	}
}

// finish stops the guard when the handler returns. Unless the response was
// cut, it answers a cut body with 408 and bounds what net/http still does
// for the request after the handler: flushing the response's last bytes
// and reading what is left of the body.
func (g *idleGuard) finish() {
	g.mu.Lock()
	g.done = true
	g.timer.Stop()
	writeCut := g.writeCut
	g.mu.Unlock()
	if writeCut {
		return
	}
	readCut := g.readCut.Load()
	writeBy := time.Now().Add(g.timeout)
	if !readCut && g.body != nil && !g.body.eof.Load() {
		g.rc.SetReadDeadline(writeBy)
		// net/http reads the rest away before it writes the response.
		writeBy = writeBy.Add(g.timeout)
	}
	g.rc.SetWriteDeadline(writeBy)
	if readCut && !g.responded.Load() {
		g.w.answerTimeout()
	}
}

// idleBody is the request body under the guard.
type idleBody struct {
	io.ReadCloser
	g   *idleGuard
	eof atomic.Bool
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.g.begin(&b.g.reading)
	n, err := b.ReadCloser.Read(p)
	b.g.end(&b.g.reading, n > 0)
	switch {
	case err == io.EOF:
		b.eof.Store(true)
	case err != nil && b.g.readCut.Load():
		err = &idleError{timeout: b.g.timeout, cause: err}
	}
	return n, err
}

// idleWriter is the response under the guard.
type idleWriter struct {
	http.ResponseWriter
	g        *idleGuard
	timedOut bool // the 408 went out instead of the handler's answer
}

// WriteHeader passes the status on, unless the body was cut before it: then
// the user gets the 408 instead of whatever the failed forward produced.
func (w *idleWriter) WriteHeader(code int) {
	switch {
	case w.timedOut || w.g.responded.Load():
		return
	case code >= 100 && code < 200 && code != http.StatusSwitchingProtocols:
		w.ResponseWriter.WriteHeader(code) // informational: more follow
	case w.g.readCut.Load():
		w.answerTimeout()
	default:
		w.g.responded.Store(true)
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *idleWriter) Write(p []byte) (int, error) {
	if !w.g.responded.Load() {
		w.WriteHeader(http.StatusOK)
	}
	if w.timedOut {
		return 0, &idleError{timeout: w.g.timeout}
	}
	w.g.begin(&w.g.writing)
	n, err := w.ResponseWriter.Write(p)
	w.g.end(&w.g.writing, n > 0)
	return n, err
}

// FlushError flushes under the guard; http.ResponseController finds it.
func (w *idleWriter) FlushError() error {
	if w.timedOut {
		return nil
	}
	if !w.g.responded.Load() {
		w.WriteHeader(http.StatusOK)
	}
	w.g.begin(&w.g.writing)
	err := http.NewResponseController(w.ResponseWriter).Flush()
	w.g.end(&w.g.writing, err == nil)
	return err
}

// Flush implements http.Flusher.
func (w *idleWriter) Flush() { w.FlushError() }

// Unwrap gives http.ResponseController the server's ResponseWriter.
func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// answerTimeout answers 408 in place of the handler's response. An
// HTTP/1.x connection closes after it: the rest of the body is still on it.
// (On HTTP/2, "Connection: close" would shut down every stream of the
// connection.)
func (w *idleWriter) answerTimeout() {
	w.timedOut = true
	w.g.responded.Store(true)
	h := w.ResponseWriter.Header()
	clear(h) // what the failed forward may have copied from the device
	if w.g.http1 {
		h.Set("Connection", "close")
	}
	textError(w.ResponseWriter, http.StatusRequestTimeout, (&idleError{timeout: w.g.timeout}).Error())
}

// idleError is a request body cut by the guard.
type idleError struct {
	timeout time.Duration
	cause   error // the read's own error: a deadline exceeded
}

func (e *idleError) Error() string {
	return fmt.Sprintf("no byte of the request body arrived for %v; the relay stopped waiting for it", e.timeout)
}

func (e *idleError) Unwrap() error { return e.cause }

// HTTPStatus returns 408 Request Timeout.
func (e *idleError) HTTPStatus() int { return http.StatusRequestTimeout }
