// Package h1 is an HTTP/1.1 client whose connections are streams of a
// multiplexed session (package mux), in place of a net/http.Transport:
// the relay's client to a version 2 agent's HTTP service, and a
// forwarding relay's to a device's agent through the relay holding it.
// Its caller says how a stream is opened; the client pools them.
//
//	c := &h1.Client{Open: func(ctx context.Context) (*mux.Stream, error) { ... }}
//	resp, err := c.RoundTrip(req) // req's URL path and Host are the service's
//	c.CloseIdle(true)             // the session drains: pool no more
package h1

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/replay"
)

// Client is an HTTP/1.1 client over streams to one HTTP service: a round trip writes the request and reads the answer on the caller's
// goroutine, so that a request crosses no goroutine of the client's own.
// A request body is written on one more goroutine, started only when
// there is a body, so that the answer can stream back while the body
// goes out (a streamed upload, full duplex).
//
// A stream whose exchange ended cleanly (its answer read to the end, its
// request wholly written, neither side asking to close) waits in a pool
// of at most MaxIdle for the next request; one idle longer than
// IdleTimeout is closed. Idle streams cost no goroutine and no timer
// each: one timer per client, armed while any stream waits, sweeps the
// expired ones, and a stream is checked (mux.Stream.Quiet) when it is
// taken. Every other end of an exchange resets its stream, which makes
// the agent close its connection to the service at once.
//
// The zero Client with Open set is ready; it must not be copied after
// first use.
type Client struct {
	// Open opens a stream to the service. Its error is a *mux.OpenError
	// when nothing of the request was sent, so that package replay may
	// send it again. Required.
	Open func(context.Context) (*mux.Stream, error)
	// Reuse, when set, reports whether a stream whose exchange ended
	// cleanly may carry another request; one it refuses is reset instead
	// of pooled. It is asked with the pool's lock held: see Evict.
	Reuse func(*mux.Stream) bool
	// Ended, when set, is told of each stream the client reset or closed,
	// perhaps more than once: the caller may forget what it kept of it.
	Ended func(*mux.Stream)

	mu      sync.Mutex   // guards the fields below
	idle    []idleStream // oldest first
	sweeper *time.Timer  // closes expired idle streams; nil until first needed
	armed   bool         // sweeper is due to run
	closed  bool         // no stream goes idle any more (the session drains or ended)
}

// idleStream is a pooled stream and when it went idle.
type idleStream struct {
	st    *mux.Stream
	since time.Time
}

// IdleTimeout is how long an idle pooled stream stays open: long enough
// to be reused by the next burst, short enough not to hold the service's
// connections for nothing.
const IdleTimeout = 30 * time.Second

// MaxIdle is how many idle pooled streams one client keeps for reuse:
// generous for bursts, each costing its stream (no buffer: those are
// pooled while a request moves) and a connection to the service on the
// far end.
const MaxIdle = 256

// Limits of the client, net/http.Transport's defaults where it has them.
const (
	// maxResponseHeaderBytes bounds an answer's header (each 1xx's too).
	maxResponseHeaderBytes = 10 << 20
	// max1xxResponses bounds the informational answers before the final
	// one that nothing above the client asked to see.
	max1xxResponses = 5
	// expectContinueTimeout is how long a request with Expect:
	// 100-continue waits for the service's 100 before its body goes
	// anyway (http.DefaultTransport's).
	expectContinueTimeout = time.Second
	// writeGrace is how long a finished answer waits for its request body
	// to finish going out before the stream is given up instead of pooled
	// (net/http's Transport waits as long).
	writeGrace = 50 * time.Millisecond
)

// ErrResponseHeaderTooLarge fails a round trip whose answer's header is
// over the client's bound.
var ErrResponseHeaderTooLarge = fmt.Errorf("the service's response header is over %d bytes", maxResponseHeaderBytes)

// Errors of the client's own.
var (
	errTooMany1xx = errors.New("the service sent too many informational (1xx) responses")
	errBodyClosed = errors.New("read on a closed response body")
	// errNoContinue stops a request body the service answered before it
	// asked for it (a final status instead of 100 Continue).
	errNoContinue = errors.New("the service answered before asking for the request body")
)

// RoundTrip sends req, whose URL path and Host are the service's already,
// on an idle stream or a new one. Like net/http's Transport, it sends req
// once more on a new stream when an idle stream turns out to have been
// closed by the service (nothing came back), if req may be sent again.
func (c *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := validRequest(req); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	var lost error // the failure on a stale idle stream, when req goes again
	for {
		st, reused, err := c.get(req.Context(), lost != nil)
		if err != nil {
			if req.Body != nil {
				req.Body.Close()
			}
			// A new stream that cannot open does not undo the first
			// attempt: it may have reached the service.
			return nil, cmp.Or(lost, err)
		}
		resp, back, err := c.exchange(st, req)
		if err == nil || !reused || back || !replay.Repeatable(req) {
			return resp, err
		}
		lost = err
	}
}

// validRequest rejects what would break the request's framing on the
// wire, as net/http's Transport does.
func validRequest(req *http.Request) error {
	if m := req.Method; m != "" && !httpguts.ValidHeaderFieldName(m) {
		return fmt.Errorf("invalid method %q", m)
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("invalid header field name %q", k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("invalid header field value for %q", k)
			}
		}
	}
	return nil
}

// get returns a quiet idle stream, or else a new one.
func (c *Client) get(ctx context.Context, fresh bool) (st *mux.Stream, reused bool, err error) {
	if !fresh {
		if st := c.take(); st != nil {
			return st, true, nil
		}
	}
	st, err = c.Open(ctx)
	return st, false, err
}

// take returns the most recently pooled stream that is still quiet and
// not expired, resetting the others it finds on the way.
func (c *Client) take() *mux.Stream {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for n := len(c.idle); n > 0; n = len(c.idle) {
		is := c.idle[n-1]
		c.idle[n-1] = idleStream{}
		c.idle = c.idle[:n-1]
		if now.Sub(is.since) < IdleTimeout && is.st.Quiet() && (c.Reuse == nil || c.Reuse(is.st)) {
			return is.st
		}
		c.reset(is.st)
	}
	return nil
}

// put pools st, whose exchange ended cleanly, or resets it when the
// client takes no more or st is not quiet. Over MaxIdle, the
// oldest idle stream goes.
func (c *Client) put(st *mux.Stream) {
	c.mu.Lock()
	if c.closed || !st.Quiet() || (c.Reuse != nil && !c.Reuse(st)) {
		c.mu.Unlock()
		c.reset(st)
		return
	}
	var evicted *mux.Stream
	if len(c.idle) >= MaxIdle {
		evicted = c.idle[0].st
		c.idle = slices.Delete(c.idle, 0, 1)
	}
	c.idle = append(c.idle, idleStream{st: st, since: time.Now()})
	if !c.armed {
		c.armLocked(IdleTimeout)
	}
	c.mu.Unlock()
	if evicted != nil {
		c.reset(evicted)
	}
}

// reset resets st, whose exchange is over, and tells Ended.
func (c *Client) reset(st *mux.Stream) {
	st.Reset(mux.CodeCancel)
	if c.Ended != nil {
		c.Ended(st)
	}
}

// Evict resets st if it waits in the pool. A caller that wants st to
// carry no new request makes Reuse refuse it first, then evicts it: a
// stream then busy is reset when its exchange ends.
func (c *Client) Evict(st *mux.Stream) {
	c.mu.Lock()
	i := slices.IndexFunc(c.idle, func(is idleStream) bool { return is.st == st })
	if i >= 0 {
		c.idle = slices.Delete(c.idle, i, i+1)
	}
	c.mu.Unlock()
	if i >= 0 {
		c.reset(st)
	}
}

func (c *Client) armLocked(d time.Duration) {
	c.armed = true
	if c.sweeper == nil {
		c.sweeper = time.AfterFunc(d, c.sweep)
		return
	}
	c.sweeper.Reset(d)
}

// sweep resets the idle streams past IdleTimeout and arms the
// timer again for the oldest of the others.
func (c *Client) sweep() {
	now := time.Now()
	c.mu.Lock()
	c.armed = false
	n := 0
	for n < len(c.idle) && now.Sub(c.idle[n].since) >= IdleTimeout {
		n++
	}
	expired := slices.Clone(c.idle[:n])
	c.idle = slices.Delete(c.idle, 0, n)
	if len(c.idle) > 0 && !c.closed {
		c.armLocked(IdleTimeout - now.Sub(c.idle[0].since))
	}
	c.mu.Unlock()
	for _, is := range expired {
		c.reset(is.st)
	}
}

// CloseIdle resets the idle streams; with stop, the client pools none
// from now on (the session drains or ended).
func (c *Client) CloseIdle(stop bool) {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	if stop {
		c.closed = true
		if c.sweeper != nil {
			c.sweeper.Stop()
			c.armed = false
		}
	}
	c.mu.Unlock()
	for _, is := range idle {
		c.reset(is.st)
	}
}

// NumIdle returns how many streams wait in the pool.
func (c *Client) NumIdle() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle)
}

// trip is one request and its answer on one stream. Once the answer's
// header is read, it is the answer's body.
type trip struct {
	c    *Client
	st   *mux.Stream
	req  *http.Request
	stop func() bool // stops the reset on the request context's end
	in   answerReader
	br   *bufio.Reader // reads in; back to its pool at the answer's end

	// The request body's writer, when there is a body: wrote is closed
	// when it has ended, werr set before.
	wrote chan struct{}
	werr  error
	cont  chan bool // with Expect: 100-continue, whether to send the body

	resp  *http.Response
	body  io.ReadCloser // resp's body as http.ReadResponse gave it
	state atomic.Int32  // bodyOpen, bodyEOF or bodyClosed
}

const (
	bodyOpen int32 = iota
	bodyEOF
	bodyClosed
)

// exchange sends req on st and reads the answer's header. back reports
// whether any byte of an answer came back before a failure.
func (c *Client) exchange(st *mux.Stream, req *http.Request) (resp *http.Response, back bool, err error) {
	x := &trip{c: c, st: st, req: req}
	x.in = answerReader{st: st, left: maxResponseHeaderBytes}
	x.stop = context.AfterFunc(req.Context(), func() { c.reset(st) })
	if req.Body == nil || req.Body == http.NoBody {
		err = writeRequest(st, req)
	} else {
		x.startBody()
	}
	x.br = getReader(&x.in)
	if err == nil {
		resp, err = x.readHeader()
	}
	if err != nil {
		x.stop()
		c.reset(st)
		putReader(x.br)
		return nil, x.in.n > 0, x.cause(err)
	}
	x.in.left = math.MaxInt64
	if resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = &upgradedBody{c: c, st: st, br: x.br, stop: x.stop}
		return resp, true, nil
	}
	x.resp, x.body = resp, resp.Body
	resp.Body = x
	return resp, true, nil
}

// startBody writes the request, with its body, on a goroutine of its
// own: the exchange owns it, and it ends when the body is written, fails
// to read, or the stream fails (a reset ends a write in progress).
func (x *trip) startBody() {
	w := new(http.Request)
	*w = *x.req // a shallow copy: a retry may rewind x.req's body meanwhile
	b := &requestBody{rc: x.req.Body, ctx: x.req.Context()}
	if httpguts.HeaderValuesContainsToken(x.req.Header["Expect"], "100-continue") {
		x.cont = make(chan bool, 1)
		b.cont = x.cont
	}
	w.Body = b
	x.wrote = make(chan struct{})
	go func() {
		err := writeRequest(x.st, w)
		if b.err != nil {
			err = b.err // the user's body failed: that is the cause
		}
		x.werr = err
		close(x.wrote)
		if err != nil && err != errNoContinue {
			x.c.reset(x.st)
		}
	}()
}

// readHeader reads the final answer's header: 100 Continue lets the body
// go, other informational answers go to the request's trace (which
// httputil.ReverseProxy passes on to the user), 101 is final.
func (x *trip) readHeader() (*http.Response, error) {
	n1xx := 0
	for {
		resp, err := http.ReadResponse(x.br, x.req)
		if err != nil {
			return nil, err
		}
		code := resp.StatusCode
		if code < 100 || code > 199 || code == http.StatusSwitchingProtocols {
			x.letBody(false) // a final answer: a body not asked for yet goes no more
			return resp, nil
		}
		if code == http.StatusContinue {
			x.letBody(true)
		}
		x.in.left = maxResponseHeaderBytes
		if n1xx++; n1xx > max1xxResponses {
			return nil, errTooMany1xx
		}
		if trace := httptrace.ContextClientTrace(x.req.Context()); trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header)); err != nil {
				return nil, err
			}
			n1xx = 0 // passed on: whoever sees them bounds them
		}
	}
}

// letBody tells a body waiting for 100 Continue whether to go, once.
func (x *trip) letBody(ok bool) {
	if x.cont != nil {
		x.cont <- ok
		x.cont = nil
	}
}

// cause says why the exchange failed: a reset of this end's own is the
// request context's end or the request body's failure.
func (x *trip) cause(err error) error {
	if errors.Is(err, ErrResponseHeaderTooLarge) || !isLocalReset(err) {
		return err
	}
	if cerr := x.req.Context().Err(); cerr != nil {
		return cerr
	}
	if x.wrote != nil {
		select {
		case <-x.wrote:
			if x.werr != nil {
				return x.werr
			}
		default:
		}
	}
	return err
}

func isLocalReset(err error) bool {
	var re *mux.ResetError
	return errors.As(err, &re) && !re.Remote
}

// Read reads the answer's body. At its end, the stream goes back to the
// pool if the exchange ended cleanly.
func (x *trip) Read(p []byte) (int, error) {
	switch x.state.Load() {
	case bodyEOF:
		return 0, io.EOF
	case bodyClosed:
		return 0, errBodyClosed
	}
	n, err := x.body.Read(p)
	switch {
	case err == nil:
		return n, nil
	case err == io.EOF:
		if x.state.CompareAndSwap(bodyOpen, bodyEOF) {
			x.finish()
		}
		return n, io.EOF
	}
	if x.state.CompareAndSwap(bodyOpen, bodyClosed) {
		x.stop()
		x.c.reset(x.st)
		putReader(x.br)
	}
	return n, x.cause(err)
}

// Close ends the answer: a body not read to its end resets the stream.
func (x *trip) Close() error {
	if x.body == http.NoBody && x.state.CompareAndSwap(bodyOpen, bodyEOF) {
		x.finish() // nothing to read: the answer is whole
		return nil
	}
	if x.state.CompareAndSwap(bodyOpen, bodyClosed) {
		// A Read may be running: its buffer is left to the collector.
		x.stop()
		x.c.reset(x.st)
	}
	return nil
}

// finish ends an answer read to its end: its stream goes back to the pool
// when the exchange ended cleanly, else is reset.
func (x *trip) finish() {
	reuse := x.stop() && // false: the request's context ended, and resets the stream
		!x.resp.Close && !x.req.Close &&
		!httpguts.HeaderValuesContainsToken(x.req.Header["Connection"], "close") &&
		x.br.Buffered() == 0 && x.bodyWritten()
	putReader(x.br)
	if reuse {
		x.c.put(x.st)
	} else {
		x.c.reset(x.st)
	}
}

// bodyWritten reports whether the request body, if any, was wholly
// written, waiting writeGrace at most for its writer to end.
func (x *trip) bodyWritten() bool {
	if x.wrote == nil {
		return true
	}
	select {
	case <-x.wrote:
		return x.werr == nil
	default:
	}
	t := time.NewTimer(writeGrace)
	defer t.Stop()
	select {
	case <-x.wrote:
		return x.werr == nil
	case <-t.C:
		return false
	}
}

// requestBody is the request body as the writer reads it: it records the
// body's own failure, and with Expect: 100-continue waits for the
// service's word (or expectContinueTimeout) before its first read.
type requestBody struct {
	rc   io.ReadCloser
	ctx  context.Context
	cont <-chan bool // nil: no need to wait
	err  error       // the body's read error, or errNoContinue
}

func (b *requestBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.cont != nil {
		if err := b.waitContinue(); err != nil {
			b.err = err
			return 0, err
		}
	}
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func (b *requestBody) waitContinue() error {
	t := time.NewTimer(expectContinueTimeout)
	defer t.Stop()
	cont := b.cont
	b.cont = nil
	select {
	case ok := <-cont:
		if !ok {
			return errNoContinue
		}
	case <-t.C: // the service may not know 100-continue: send anyway
	case <-b.ctx.Done():
		return b.ctx.Err()
	}
	return nil
}

func (b *requestBody) Close() error { return b.rc.Close() }

// answerReader reads the answer from the stream, counting its bytes and
// bounding its header.
type answerReader struct {
	st   *mux.Stream
	left int64 // bytes the header being read may still take
	n    int64 // bytes read in all
}

func (r *answerReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, ErrResponseHeaderTooLarge
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.st.Read(p)
	r.left -= int64(n)
	r.n += int64(n)
	return n, err
}

// upgradedBody is a 101 answer's body: the stream both ways, the bytes
// read past the answer's header first. Close resets the stream, unless
// its sending side was half-closed, when Close delivers what was written.
type upgradedBody struct {
	c          *Client
	st         *mux.Stream
	br         *bufio.Reader // until what it holds is read; then back to its pool and nil
	stop       func() bool
	halfClosed atomic.Bool
	closed     atomic.Bool
}

func (u *upgradedBody) Read(p []byte) (int, error) {
	if u.br != nil {
		if u.br.Buffered() > 0 {
			n, _ := u.br.Read(p) // from its buffer alone
			return n, nil
		}
		u.dropReader()
	}
	return u.st.Read(p)
}

// WriteTo writes what the service sends to w until it half-closes: the
// bytes read past the header, then the stream's own copy.
func (u *upgradedBody) WriteTo(w io.Writer) (int64, error) { return mux.RunSteps(u.WriteStep(w)) }

// ReadFrom writes what r reads to the service, with the stream's own
// copy.
func (u *upgradedBody) ReadFrom(r io.Reader) (int64, error) { return mux.RunSteps(u.ReadStep(r)) }

// WriteStep and ReadStep are WriteTo's and ReadFrom's copies in steps
// (see mux.StepWriterTo): the bytes read past the header are the first.
func (u *upgradedBody) WriteStep(w io.Writer) func() (int, error) {
	next := mux.WriteSteps(u.st, w)
	return func() (int, error) {
		if u.br == nil {
			return next()
		}
		n := u.br.Buffered()
		if n == 0 {
			u.dropReader()
			return next()
		}
		b, _ := u.br.Peek(n)
		k, err := w.Write(b)
		u.br.Discard(k)
		if err == nil {
			u.dropReader()
		}
		return k, err
	}
}

func (u *upgradedBody) ReadStep(r io.Reader) func() (int, error) { return mux.ReadSteps(u.st, r) }

func (u *upgradedBody) dropReader() {
	putReader(u.br)
	u.br = nil
}

func (u *upgradedBody) Write(p []byte) (int, error) { return u.st.Write(p) }

// CloseWrite half-closes the stream.
func (u *upgradedBody) CloseWrite() error {
	u.halfClosed.Store(true)
	return u.st.CloseWrite()
}

// Close resets the stream, or closes it after a half-close.
func (u *upgradedBody) Close() error {
	if !u.closed.CompareAndSwap(false, true) {
		return nil
	}
	u.stop()
	if u.c.Ended != nil {
		defer u.c.Ended(u.st)
	}
	if u.halfClosed.Load() {
		return u.st.Close()
	}
	return u.st.Reset(mux.CodeCancel)
}

// streamWriter is a stream as a request is written to it. Its ReadFrom,
// which bufio.Writer passes a body on to, copies in large writes (the
// stream's own ReadFrom when it has one), not through the 4 KiB buffer of
// the bufio.Writer: a frame and a wait per 4 KiB halved the upload.
type streamWriter struct{ st *mux.Stream }

func (w streamWriter) Write(p []byte) (int, error) { return w.st.Write(p) }

func (w streamWriter) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := any(w.st).(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	buf := copyBuffers.Get().(*[32 << 10]byte)
	defer copyBuffers.Put(buf)
	return io.CopyBuffer(onlyWriter{w.st}, r, buf[:])
}

// onlyWriter hides a stream's ReadFrom from io.Copy.
type onlyWriter struct{ io.Writer }

// writeRequest writes req to st through a pooled buffer.
func writeRequest(st *mux.Stream, req *http.Request) error {
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(streamWriter{st})
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	return err
}

// The buffers of requests being written and answers being read: an idle
// stream holds none.
var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
)

// copyBuffers recycles the buffers of request bodies copied to streams
// that have no ReadFrom of their own.
var copyBuffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func getReader(r io.Reader) *bufio.Reader {
	br := readers.Get().(*bufio.Reader)
	br.Reset(r)
	return br
}

func putReader(br *bufio.Reader) {
	br.Reset(nil)
	readers.Put(br)
}
