package ports

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/flows"
	"github.com/switchboard-relay/switchboard/internal/proxyproto"
	"github.com/switchboard-relay/switchboard/internal/splice"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/lograte"
)

// DefaultUDPIdle is how long a UDP flow lasts without a datagram either way.
const DefaultUDPIdle = flows.DefaultIdle

// DefaultUDPQueue is how many datagrams a UDP flow holds for its device
// before it drops new ones.
const DefaultUDPQueue = flows.DefaultQueue

// Listeners keeps this relay listening on every mapped port and carries
// each connection (UDP: each flow) to its device's service through Open.
type Listeners struct {
	// Host is the address the ports are opened on: the public listener's
	// host ("" for every address).
	Host string
	Open connect.Opener
	// UDPIdle and UDPQueue: DefaultUDPIdle and DefaultUDPQueue if zero.
	UDPIdle  time.Duration
	UDPQueue int
	// Conns accounts for every TCP connection carried (metrics, the log
	// and the event log, a drain's wait); nil accounts for none.
	Conns  *tcpconns.Tracker
	Logger *slog.Logger

	mu       sync.Mutex // guards the fields below
	open     map[string]port
	ctx      context.Context
	close    context.CancelFunc
	draining bool // StopAccepting was called: no port opens any more
}

// port is one open mapped port.
type port interface {
	mapping() Mapping
	stopAccepting() // closes the port to new connections, keeping those open
	stop()          // closes the port and every connection through it, and waits
}

// StopAccepting closes the TCP ports to new connections and keeps those
// open, as a drain does when the relay's public listener closes: they run
// on until they end or Close cuts them. No port opens after it; a mapping
// removed meanwhile still closes its port and its connections.
func (l *Listeners) StopAccepting() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.draining = true
	for _, p := range l.open {
		p.stopAccepting()
	}
}

// Apply opens the ports of ms that are not open, and closes those open
// that ms no longer maps (or maps differently). It returns an error for
// each port it could not open (in use on this host, say); the others are
// open.
func (l *Listeners) Apply(ms []Mapping) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open == nil {
		l.open = map[string]port{}
		l.ctx, l.close = context.WithCancel(context.Background())
	}
	want := map[string]Mapping{}
	for _, m := range ms {
		want[m.Key()] = m
	}
	for key, p := range l.open {
		if m, ok := want[key]; !ok || !sameMapping(m, p.mapping()) {
			p.stop()
			delete(l.open, key)
		}
	}
	var errs []error
	for key, m := range want {
		if _, ok := l.open[key]; ok || l.draining {
			continue
		}
		p, err := l.start(m)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s port %d for %s: %w", m.Network, m.Port, m.Target, err))
			continue
		}
		l.open[key] = p
	}
	return errors.Join(errs...)
}

func sameMapping(a, b Mapping) bool {
	return a.Target == b.Target && a.MaxConns == b.MaxConns && a.ProxyProtocol == b.ProxyProtocol && fmt.Sprint(a.Allow) == fmt.Sprint(b.Allow)
}

// Close closes every port and the connections through them.
func (l *Listeners) Close() {
	l.Apply(nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.close != nil {
		l.close()
	}
}

func (l *Listeners) start(m Mapping) (port, error) {
	target, err := connect.ParseTarget(m.Target)
	if err != nil {
		return nil, err
	}
	prefixes, err := m.prefixes()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(l.Host, strconv.Itoa(m.Port))
	log := cmp.Or(l.Logger, slog.New(slog.DiscardHandler)).With(logkey.Component, "ports", logkey.Port, m.Port, logkey.Network, m.Network, logkey.Target, m.Target)
	base := &portBase{m: m, target: target, prefixes: prefixes, open: l.Open, log: log, lines: lograte.New(lograte.DefaultPerSecond),
		acct: l.Conns, conns: map[net.Conn]struct{}{}}
	if m.MaxConns > 0 {
		base.slots = make(chan struct{}, m.MaxConns)
	}
	ctx, cancel := context.WithCancel(l.ctx)
	base.ctx, base.cancel = ctx, cancel
	if m.Network == UDP {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			cancel()
			return nil, err
		}
		base.target.Network = connect.UDP
		return newUDPPort(base, pc, flows.Config{Idle: l.UDPIdle, Queue: l.UDPQueue, Logger: log, Lines: base.lines}), nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		cancel()
		return nil, err
	}
	p := &tcpPort{portBase: base, ln: ln}
	p.wg.Go(p.accept)
	return p, nil
}

// portBase is what TCP and UDP ports share.
type portBase struct {
	m        Mapping
	target   connect.Target
	prefixes []netip.Prefix
	open     connect.Opener
	log      *slog.Logger
	lines    *lograte.Limiter  // bounds the refusals' lines (and the UDP flows'), which whoever reaches the port drives
	acct     *tcpconns.Tracker // nil: connections are not accounted for
	slots    chan struct{}     // a token per connection open, when bounded
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
}

func (p *portBase) mapping() Mapping { return p.m }

// admit reports whether a connection from src may go on, taking a slot.
func (p *portBase) admit(src netip.AddrPort) bool {
	if !allows(p.prefixes, src.Addr()) {
		p.lines.InfoTo(p.log, "connection refused: source not allowed", logkey.Source, src)
		p.refuseConn(src, tcpconns.ReasonSource)
		return false
	}
	if p.slots == nil {
		return true
	}
	select {
	case p.slots <- struct{}{}:
		return true
	default:
		p.lines.InfoTo(p.log, "connection refused: the port's connection limit is reached", logkey.Source, src, logkey.Limit, p.m.MaxConns)
		p.refuseConn(src, tcpconns.ReasonLimit)
		return false
	}
}

// refuseConn accounts for a connection from src refused for reason by
// the port itself. A UDP port asks for every datagram of a source with
// no flow, so that its refusals are datagrams dropped, not counted.
func (p *portBase) refuseConn(src netip.AddrPort, reason string) {
	if p.m.Network != UDP {
		p.refuse(src, reason, nil)
	}
}

// refuse accounts for a connection (UDP: a flow) from src refused for
// reason.
func (p *portBase) refuse(src netip.AddrPort, reason string, err error) {
	if p.acct == nil {
		return
	}
	kind := tcpconns.Port
	if p.m.Network == UDP {
		kind = tcpconns.PortUDP
	}
	p.acct.Refuse(kind, strconv.Itoa(p.m.Port), p.m.Target, src.String(), reason, err)
}

// reasonOf names the refusal err is, unreachable when it is none of
// connect's.
func reasonOf(err error) string {
	return cmp.Or(connect.Reason(err), tcpconns.ReasonUnreachable)
}

func (p *portBase) release() {
	if p.slots != nil {
		<-p.slots
	}
}

// track keeps c to be closed when the port closes; untrack forgets it.
func (p *portBase) track(c net.Conn) {
	p.mu.Lock()
	p.conns[c] = struct{}{}
	p.mu.Unlock()
}

func (p *portBase) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *portBase) closeConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// tcpPort is a mapped TCP port.
type tcpPort struct {
	*portBase
	ln net.Listener
}

func (p *tcpPort) stopAccepting() { p.ln.Close() }

func (p *tcpPort) stop() {
	p.cancel()
	p.ln.Close()
	p.closeConns()
	p.wg.Wait()
}

func (p *tcpPort) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.Warn("accepting stopped", logkey.Err, err)
			}
			return
		}
		src := netip.MustParseAddrPort(c.RemoteAddr().String())
		if !p.admit(src) {
			c.Close()
			continue
		}
		p.track(c)
		p.wg.Add(1)
		go p.serve(c, src, func() {
			c.Close()
			p.untrack(c)
			p.release()
			p.wg.Done()
		})
	}
}

// serve carries one connection to the device's service, calling end once
// it has ended. It returns once the joining has started: the copies wait
// for bytes in goroutines of their own (splice.Start), so that an idle
// connection holds no goroutine whose stack grew while it opened.
func (p *tcpPort) serve(c net.Conn, src netip.AddrPort, end func()) {
	start := time.Now()
	dev, err := p.open.Open(p.ctx, p.target)
	if err != nil {
		p.lines.InfoTo(p.log, "connection refused", logkey.Source, src, logkey.Err, err)
		p.refuse(src, reasonOf(err), err)
		end()
		return
	}
	p.track(dev)
	done := func() {
		p.untrack(dev)
		end()
	}
	if p.m.ProxyProtocol {
		dst, _ := netip.ParseAddrPort(c.LocalAddr().String())
		hdr, err := proxyproto.Append(nil, proxyproto.Header{Source: src, Destination: dst})
		if err == nil {
			_, err = dev.Write(hdr)
		}
		if err != nil {
			p.lines.InfoTo(p.log, "connection ended: the PROXY header could not be sent", logkey.Source, src, logkey.Err, err)
			p.refuse(src, cmp.Or(connect.Reason(err), tcpconns.ReasonProxyHeader), err)
			dev.Close()
			done()
			return
		}
	}
	if p.acct == nil {
		p.log.Info("connected", logkey.Source, src)
		splice.Start(c, dev, func(res splice.Result) {
			defer done()
			p.log.Info("disconnected", logkey.Source, src, logkey.DurationMS, time.Since(start).Milliseconds(),
				logkey.BytesIn, res.AToB, logkey.BytesOut, res.BToA)
		})
		return
	}
	tc := p.acct.Open(tcpconns.Port, strconv.Itoa(p.m.Port), p.m.Target, src.String(), func() {
		c.Close()
		dev.Close()
	})
	splice.Start(c, dev, func(res splice.Result) {
		defer done()
		if reason := connect.Reason(res.Err); reason != "" && res.BToA == 0 {
			tc.Refused(reason, res.Err)
			return
		}
		tc.Close(res.AToB, res.BToA)
	})
}
