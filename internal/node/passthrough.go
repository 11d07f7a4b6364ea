package node

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/sni"
	"github.com/switchboard-relay/switchboard/internal/splice"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// TLS alerts the relay answers a passthrough it cannot carry with, in a
// plaintext record before any server hello, so that the user's TLS client
// says why: the name reaches no service offered for passthrough, or the
// service could not be reached.
const (
	alertAccessDenied     = 49
	alertInternalError    = 80
	alertUnrecognizedName = 112
)

// passthroughAnswer bounds how long a passthrough waits for the service's
// first bytes (its server hello) before it tells the user the service
// could not be reached: the agent's dial of the service takes 10 s at
// most, a TLS server answers a hello at once.
const passthroughAnswer = 30 * time.Second

// sniListener is the public TLS listener when passthrough is on. It reads
// each connection's ClientHello: a name SERVICE--DEVICE.ZONE is passed
// through whole to the device's service (its agent offers it for
// passthrough), here or one hop to the relay holding the device; every
// other connection, its hello bytes replayed, goes to the relay's own TLS
// server through Accept.
type sniListener struct {
	net.Listener
	zone   string
	hello  time.Duration // how long a client may take to send its hello
	answer time.Duration // how long the service may take to answer it
	open   func(ctx context.Context, t connect.Target) (net.Conn, error)
	acct   *tcpconns.Tracker // accounts for every passthrough: metrics, logs, events, a drain's wait
	log    *slog.Logger
	ctx    context.Context // ends with closeAll: the relay stops
	stop   context.CancelFunc

	conns     chan net.Conn // for the relay's own TLS server
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	stopped   chan struct{} // closed when the accept loop has ended
	wg        sync.WaitGroup

	mu    sync.Mutex // guards pipes
	pipes map[net.Conn]struct{}
}

func newSNIListener(inner net.Listener, zone string, hello time.Duration, open func(context.Context, connect.Target) (net.Conn, error), conns *tcpconns.Tracker, log *slog.Logger) *sniListener {
	l := &sniListener{
		Listener: inner, zone: zone, hello: hello, answer: passthroughAnswer, open: open, acct: conns,
		log:   log.With(logkey.Component, "passthrough"),
		conns: make(chan net.Conn), done: make(chan struct{}), stopped: make(chan struct{}),
		pipes: map[net.Conn]struct{}{},
	}
	l.ctx, l.stop = context.WithCancel(context.Background())
	go l.acceptLoop()
	return l
}

// Accept returns the next connection the relay terminates itself.
func (l *sniListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.stopped:
		return nil, net.ErrClosed
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; the passthroughs go on until closeAll.
func (l *sniListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}

// closeAll closes the listener and every passthrough, and waits for their
// goroutines.
func (l *sniListener) closeAll() {
	l.Close()
	<-l.stopped
	l.stop()
	l.mu.Lock()
	for c := range l.pipes {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *sniListener) acceptLoop() {
	defer close(l.stopped)
	for {
		c, err := l.Listener.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // out of file descriptors, say: wait a little, as net/http does
			l.log.Warn("accepting failed", logkey.Err, err)
			select {
			case <-time.After(50 * time.Millisecond):
				continue
			case <-l.done:
				return
			}
		}
		l.track(c)
		l.wg.Add(1)
		go l.route(c)
	}
}

// route reads c's hello and passes c through or on to the relay's server.
// It marks l.wg done once c is handed on, or once its passthrough has
// ended.
func (l *sniListener) route(c net.Conn) {
	ctx, cancel := context.WithTimeout(l.ctx, l.hello)
	hello, err := sni.ReadHello(ctx, c)
	cancel()
	if err != nil { // no name, not TLS, too slow: the relay's own TLS answers
		l.toServer(c, hello.Raw)
		l.wg.Done()
		return
	}
	name, err := sni.ParseName(hello.ServerName, l.zone)
	if errors.Is(err, sni.ErrNotInZone) { // the relay's own names
		l.toServer(c, hello.Raw)
		l.wg.Done()
		return
	}
	end := func() {
		c.Close()
		l.untrack(c)
		l.wg.Done()
	}
	if err != nil { // under the zone, but not SERVICE--DEVICE
		l.acct.Refuse(tcpconns.Passthrough, "", hello.ServerName, c.RemoteAddr().String(), tcpconns.ReasonBadTarget, err)
		writeAlert(c, alertUnrecognizedName)
		end()
		return
	}
	l.passthrough(c, hello, name, end)
}

// toServer hands c to the relay's own TLS server, the bytes read from it
// first.
func (l *sniListener) toServer(c net.Conn, read []byte) {
	l.untrack(c) // the server owns it from here
	select {
	case l.conns <- &replayConn{Conn: c, head: read}:
	case <-l.done:
		c.Close()
	}
}

// passthrough carries c, whose hello asked for name, to the service,
// calling end once it has ended. It returns once the joining has started:
// the copies wait for bytes in goroutines of their own (splice.Start), so
// that an idle passthrough holds no goroutine whose stack grew while it
// opened.
func (l *sniListener) passthrough(c net.Conn, hello sni.Hello, name sni.Name, end func()) {
	src := c.RemoteAddr().String()
	target := connect.Target{Device: name.Device, Service: name.Service, Network: connect.Passthrough}
	dev, err := l.open(l.ctx, target)
	if err == nil {
		l.track(dev)
		endClient := end
		end = func() {
			dev.Close()
			l.untrack(dev)
			endClient()
		}
		_, err = dev.Write(hello.Raw)
	}
	// The open costs no round trip: a refusal shows as the first read's
	// error, and the client, its hello sent, waits for the server's.
	var first [16 << 10]byte
	n := 0
	if err == nil {
		dev.SetReadDeadline(time.Now().Add(l.answer))
		n, err = dev.Read(first[:])
		dev.SetReadDeadline(time.Time{})
	}
	if err != nil && n == 0 {
		l.refuse(target, src, err)
		writeAlert(c, alertFor(err))
		end()
		return
	}
	if _, err := c.Write(first[:n]); err != nil {
		end()
		return
	}
	tc := l.acct.Open(tcpconns.Passthrough, name.Service, target.String(), src, func() {
		c.Close()
		dev.Close()
	})
	splice.Start(c, dev, func(res splice.Result) {
		defer end()
		tc.Close(res.AToB+int64(len(hello.Raw)), res.BToA+int64(n))
	})
}

// refuse accounts for a passthrough to target refused with err: the
// service's name labels the refusal only when it is not the user's to
// make up (see tcpconns.Tracker.Refuse).
func (l *sniListener) refuse(target connect.Target, src string, err error) {
	reason := cmp.Or(connect.Reason(err), tcpconns.ReasonUnreachable)
	svc := target.Service
	if reason == tcpconns.ReasonUnknownService || reason == tcpconns.ReasonForbidden {
		svc = ""
	}
	l.acct.Refuse(tcpconns.Passthrough, svc, target.String(), src, reason, err)
}

// alertFor is the TLS alert that tells a user why a passthrough failed.
func alertFor(err error) byte {
	switch {
	case errors.Is(err, connect.ErrNoDevice), errors.Is(err, connect.ErrUnknownService):
		return alertUnrecognizedName
	case errors.Is(err, connect.ErrForbidden):
		return alertAccessDenied
	}
	return alertInternalError
}

// writeAlert sends a fatal TLS alert in a plaintext record, as a server
// does before its hello.
func writeAlert(c net.Conn, desc byte) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write([]byte{21, 3, 1, 0, 2, 2, desc}) // alert record, TLS 1.0 framing, level fatal
}

func (l *sniListener) track(c net.Conn) {
	l.mu.Lock()
	l.pipes[c] = struct{}{}
	l.mu.Unlock()
}

func (l *sniListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.pipes, c)
	l.mu.Unlock()
}

// replayConn reads head before the connection: the bytes of the hello
// that routing read.
type replayConn struct {
	net.Conn
	head []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
