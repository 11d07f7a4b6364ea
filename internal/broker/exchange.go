package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/wire"
)

// Exchange states.
const (
	stateQueued  int32 = iota // waiting in its device's queue
	stateTaken                // handed to an agent's poll
	stateExpired              // the user side gave up before any agent took it
)

// Exchange is one user request from enqueue until its response is finished.
type Exchange struct {
	// ID is "<device>:<32 lowercase hex>", the protocol's request id.
	ID string
	// Device is the device name the request is for.
	Device string

	msg      *wire.Request       // the request for the agent
	ctx      context.Context     // the user request's context
	state    atomic.Int32        // stateQueued, stateTaken or stateExpired
	chunks   chan *wire.Response // agent → user, unbuffered: Deliver returns once the user side took it
	upstream chan []byte         // user → agent after a 101, unbuffered
	upClosed chan struct{}       // closed when the user half-closes an upgraded stream
	done     chan struct{}       // closed when the user side is finished
	failed   chan error          // carries the reason when Requeue cannot find another poll
	once     sync.Once           // guards closing done
	upOnce   sync.Once           // guards closing upClosed
	b        *Broker
	agentID  string // the credential id of the agent that took it; guarded by Broker.mu
	instance string // the agent process that took it; guarded by Broker.mu
}

// Message returns the encoded HttpRequest to send to the agent.
func (ex *Exchange) Message() []byte {
	var b bytes.Buffer
	ex.msg.WriteTo(&b)
	return b.Bytes()
}

// MessageSize returns the length of the encoded HttpRequest.
func (ex *Exchange) MessageSize() int { return ex.msg.Size() }

// WriteMessage writes the encoded HttpRequest to w without copying its body.
func (ex *Exchange) WriteMessage(w io.Writer) error {
	_, err := ex.msg.WriteTo(w)
	return err
}

// take hands ex to the agent agentID unless the user side already gave up.
func (b *Broker) take(ex *Exchange, agentID, instance string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !ex.state.CompareAndSwap(stateQueued, stateTaken) {
		return false
	}
	ex.agentID = agentID
	b.untrackLocked(ex)
	ex.instance = instance
	if in := b.instances[instance]; in != nil {
		in.exchanges[ex] = struct{}{}
	}
	return true
}

// untrackLocked removes ex from the instance that took it.
func (b *Broker) untrackLocked(ex *Exchange) {
	if in := b.instances[ex.instance]; in != nil {
		delete(in.exchanges, ex)
	}
	ex.instance = ""
}

// fail ends a queued exchange with err, for the user side to report.
func (ex *Exchange) fail(err error) {
	select {
	case ex.failed <- err:
	default:
	}
}

// finish removes ex from the broker and wakes everything waiting on it.
func (ex *Exchange) finish() {
	ex.once.Do(func() {
		close(ex.done)
		b := ex.b
		b.mu.Lock()
		delete(b.exchanges, ex.ID)
		b.untrackLocked(ex)
		b.checkIdleLocked()
		n := len(b.exchanges)
		b.mu.Unlock()
		b.metrics.active.Set(float64(n))
	})
}

// RoundTrip implements http.RoundTripper: it queues req for the agent of the
// device named by req.URL.Host and returns the agent's response. The body is
// read whole (the protocol carries it in one message), up to MaxBodyBytes.
// Errors that users should see as a status are *Error values.
func (b *Broker) RoundTrip(req *http.Request) (*http.Response, error) {
	device := req.URL.Host
	// Refused before the body is read, so that a router may send it elsewhere.
	if b.isDraining() {
		b.metrics.outcome(drainingError())
		return nil, drainingError()
	}
	if !b.Remembers(device) {
		b.metrics.outcome(noAgentError(device))
		return nil, noAgentError(device)
	}
	body, err := b.readBody(req)
	if err != nil {
		return nil, err
	}
	ex, d, err := b.enqueue(req, device, body)
	if err != nil {
		b.metrics.outcome(err)
		restoreBody(req, body, err)
		return nil, err
	}
	first, err := b.awaitFirst(ex, d)
	if err != nil {
		ex.finish()
		b.metrics.outcome(err)
		restoreBody(req, body, err)
		return nil, err
	}
	resp, err := b.newResponse(req, ex, first)
	if err != nil {
		ex.finish()
		b.metrics.outcome(err)
		return nil, err
	}
	b.metrics.outcome(nil)
	return resp, nil
}

// restoreBody gives req its body back when err says that no agent took the
// request, so that a router can send it elsewhere.
func restoreBody(req *http.Request, body []byte, err error) {
	if !(errors.Is(err, ErrNoAgent) || errors.Is(err, ErrDraining)) || errors.Is(err, ErrPickup) {
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
}

func (b *Broker) readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	limit := b.cfg.MaxBodyBytes
	if req.ContentLength > limit {
		return nil, tooLargeError(limit)
	}
	body, err := readAll(req.Body, req.ContentLength, limit)
	if err != nil {
		return nil, &Error{Status: http.StatusBadRequest, Err: err, Message: "could not read the request body: " + err.Error()}
	}
	if int64(len(body)) > limit {
		return nil, tooLargeError(limit)
	}
	return body, nil
}

// readAll reads r whole, at most limit+1 bytes, into one buffer sized from
// the declared length n when there is one.
func readAll(r io.Reader, n, limit int64) ([]byte, error) {
	if n < 0 || n > limit {
		return io.ReadAll(io.LimitReader(r, limit+1))
	}
	buf := make([]byte, n, n+1)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	// A body longer than declared is the reader's error; one more byte tells.
	if m, _ := r.Read(buf[n : n+1]); m > 0 {
		return buf[:n+1], nil
	}
	return buf, nil
}

func tooLargeError(limit int64) error {
	return &Error{Status: http.StatusRequestEntityTooLarge,
		Message: fmt.Sprintf("request body exceeds the relay's %d-byte limit for long-poll agents; use the native agent protocol for streamed uploads, or raise --max-request-body", limit)}
}

// enqueue registers a new exchange for device and puts it in the device's queue.
func (b *Broker) enqueue(req *http.Request, device string, body []byte) (*Exchange, *device, error) {
	ex := &Exchange{
		ID:       b.newID(device),
		Device:   device,
		ctx:      req.Context(),
		chunks:   make(chan *wire.Response),
		upstream: make(chan []byte),
		upClosed: make(chan struct{}),
		done:     make(chan struct{}),
		failed:   make(chan error, 1),
		b:        b,
	}
	ex.msg = &wire.Request{
		ID:     ex.ID,
		Method: req.Method,
		URL:    wireURL(req),
		Header: wire.HeadersFromHTTP(req.Header),
		Body:   body,
		Host:   req.Host,
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.draining {
		return nil, nil, drainingError()
	}
	d := b.devices[device]
	if d == nil || !b.connectedLocked(d, time.Now(), b.cfg.InactiveBackendTimeout) {
		return nil, nil, noAgentError(device)
	}
	if !b.pushLocked(d, ex) {
		return nil, nil, &Error{Status: http.StatusServiceUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("device %q has %d requests waiting for its agent already; retry shortly", device, b.cfg.MaxPendingPerDevice)}
	}
	b.exchanges[ex.ID] = ex
	b.metrics.pending.Inc()
	b.metrics.active.Set(float64(len(b.exchanges)))
	return ex, d, nil
}

// pushLocked puts ex in d's queue, first clearing out requests whose users
// gave up when the queue is full. It reports whether there was room.
func (b *Broker) pushLocked(d *device, ex *Exchange) bool {
	select {
	case d.queue <- ex:
		return true
	default:
	}
	b.purgeExpiredLocked(d)
	select {
	case d.queue <- ex:
		return true
	default:
		return false
	}
}

// purgeExpiredLocked drops from d's queue the requests nobody waits for any
// more. Polls may take requests meanwhile; the rest keep their order.
func (b *Broker) purgeExpiredLocked(d *device) {
	var keep []*Exchange
	for {
		select {
		case ex := <-d.queue:
			if ex.state.Load() != stateExpired {
				keep = append(keep, ex)
			}
			continue
		default:
		}
		break
	}
	for _, ex := range keep {
		d.queue <- ex // there is room: these came out of the queue just now
	}
}

// awaitFirst waits for the agent's first chunk of ex.
func (b *Broker) awaitFirst(ex *Exchange, d *device) (*wire.Response, error) {
	b.mu.Lock()
	pickup := b.cfg.NoAgentGrace
	if b.connectedLocked(d, time.Now(), b.cfg.NoAgentGrace) {
		pickup = b.cfg.PickupTimeout
	}
	b.mu.Unlock()

	pickupTimer := time.NewTimer(pickup)
	defer pickupTimer.Stop()
	inactive := time.NewTimer(b.cfg.InactiveRequestTimeout)
	defer inactive.Stop()
	drain := b.drainCh
	for {
		select {
		case first := <-ex.chunks:
			return first, nil
		case err := <-ex.failed:
			return nil, err
		case <-pickupTimer.C:
			if ex.expire() {
				return nil, pickupError(ex.Device, pickup)
			}
		case <-drain:
			if ex.expire() {
				return nil, drainingError()
			}
			drain = nil
		case <-inactive.C:
			ex.expire()
			return nil, timeoutError(ex.Device, b.cfg.InactiveRequestTimeout, "response")
		case <-ex.ctx.Done():
			ex.expire()
			return nil, ex.ctx.Err()
		case <-b.closeCh:
			if ex.expire() {
				return nil, drainingError()
			}
			// An agent may have it: not something to send elsewhere again.
			return nil, &Error{Status: http.StatusServiceUnavailable, Message: "this relay stopped while the request was in flight"}
		}
	}
}

// expire marks a queued exchange as given up, reporting whether it was still
// queued (no agent had taken it).
func (ex *Exchange) expire() bool {
	if ex.state.CompareAndSwap(stateQueued, stateExpired) {
		ex.b.metrics.pending.Dec()
		return true
	}
	return false
}

// newResponse builds the user's response from the agent's first chunk.
func (b *Broker) newResponse(req *http.Request, ex *Exchange, first *wire.Response) (*http.Response, error) {
	if !first.HasStatus {
		return nil, &Error{Status: http.StatusBadGateway,
			Message: fmt.Sprintf("the agent for device %q sent a response without a status code", ex.Device)}
	}
	status := int(first.StatusCode)
	if status < 100 || status > 999 || (status < 200 && status != http.StatusSwitchingProtocols) {
		return nil, &Error{Status: http.StatusBadGateway,
			Message: fmt.Sprintf("the agent for device %q sent an unusable status code %d", ex.Device, first.StatusCode)}
	}
	resp := &http.Response{
		Status:        strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        make(http.Header, len(first.Header)),
		ContentLength: -1,
		Request:       req,
	}
	wire.AddToHTTP(resp.Header, first.Header)
	announceTrailers(resp)
	if cl := resp.Header.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			resp.ContentLength = n
		}
	}
	body := &responseBody{ex: ex, resp: resp, timeout: b.cfg.InactiveRequestTimeout, blockSize: b.cfg.BlockSize}
	body.apply(first)
	if status == http.StatusSwitchingProtocols {
		resp.ContentLength = 0 // as for every 1xx: no message body, the connection carries the new protocol
		resp.Body = &upgradedBody{responseBody: body}
	} else {
		resp.Body = body
	}
	return resp, nil
}

// announceTrailers turns a Trailer header into announced (still empty)
// trailers, which the reverse proxy declares to the user before the body.
func announceTrailers(resp *http.Response) {
	for _, v := range resp.Header.Values("Trailer") {
		for _, k := range strings.Split(v, ",") {
			if k = strings.TrimSpace(k); k != "" && http.CanonicalHeaderKey(k) != wire.AbortTrailer {
				if resp.Trailer == nil {
					resp.Trailer = make(http.Header)
				}
				resp.Trailer[http.CanonicalHeaderKey(k)] = nil
			}
		}
	}
	resp.Header.Del("Trailer")
}

// responseBody streams the agent's chunks to the user.
type responseBody struct {
	ex        *Exchange
	resp      *http.Response // its Trailer collects the chunks' trailers
	timeout   time.Duration
	blockSize int
	cur       []byte
	eof       bool
	err       error
}

// apply takes in one chunk: its body to read and its trailers.
func (rb *responseBody) apply(c *wire.Response) {
	rb.cur = c.Body
	for _, t := range c.Trailer {
		if http.CanonicalHeaderKey(t.Name) == wire.AbortTrailer {
			rb.err = fmt.Errorf("the backend of device %q broke off its response: %s: %w", rb.ex.Device, t.Value, io.ErrUnexpectedEOF)
			return
		}
	}
	if len(c.Trailer) > 0 {
		if rb.resp.Trailer == nil {
			rb.resp.Trailer = make(http.Header)
		}
		wire.AddToHTTP(rb.resp.Trailer, c.Trailer)
	}
	if c.EOF {
		rb.eof = true
	}
}

// Read returns the agent's response bytes as its chunks arrive.
func (rb *responseBody) Read(p []byte) (int, error) {
	for len(rb.cur) == 0 {
		if rb.eof {
			return 0, io.EOF
		}
		if rb.err != nil {
			return 0, rb.err
		}
		rb.next()
	}
	n := copy(p, rb.cur)
	rb.cur = rb.cur[n:]
	return n, nil
}

// next waits for the next chunk, at most the inactivity timeout.
func (rb *responseBody) next() {
	ex := rb.ex
	timer := time.NewTimer(rb.timeout)
	defer timer.Stop()
	select {
	case c := <-ex.chunks:
		rb.apply(c)
	case err := <-ex.failed:
		rb.err = err
	case <-timer.C:
		rb.err = timeoutError(ex.Device, rb.timeout, "data")
	case <-ex.done:
		rb.err = fmt.Errorf("response from device %q: %w", ex.Device, io.ErrUnexpectedEOF)
	case <-ex.ctx.Done():
		rb.err = ex.ctx.Err()
	}
}

// Close ends the exchange: later chunks from the agent are refused.
func (rb *responseBody) Close() error {
	rb.ex.finish()
	return nil
}

// upgradedBody is the two-way byte stream after a 101 Switching Protocols.
type upgradedBody struct {
	*responseBody
}

// Write hands the user's bytes to the agent's requeststream calls, at most
// BlockSize per call, blocking until each piece is taken.
func (ub *upgradedBody) Write(p []byte) (int, error) {
	ex := ub.ex
	written := 0
	for len(p) > 0 {
		n := min(len(p), ub.blockSize)
		piece := make([]byte, n)
		copy(piece, p[:n])
		select {
		case ex.upstream <- piece:
		case <-ex.done:
			return written, io.ErrClosedPipe
		case <-ex.upClosed:
			return written, io.ErrClosedPipe
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// CloseWrite tells the agent that the user will send no more bytes.
func (ub *upgradedBody) CloseWrite() error {
	ub.ex.upOnce.Do(func() { close(ub.ex.upClosed) })
	return nil
}

// newID returns a fresh request id for device (wire.NewRequestID), its
// hex starting with the broker's IDPrefix, when set, so that any relay can
// tell which relay a request id belongs to.
func (b *Broker) newID(device string) string { return wire.NewRequestID(device, b.cfg.IDPrefix) }

// wireURL renders req's target as the protocol wants it: http://invalid<path>?<query>#<fragment>.
func wireURL(req *http.Request) string {
	u := *req.URL
	u.Scheme, u.Host, u.User = "http", "invalid", nil
	return u.String()
}

func quote(s string) string { return strconv.Quote(s) }
