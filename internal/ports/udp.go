package ports

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/flows"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"
)

// udpPort is a mapped UDP port. Each source address is a flow: one stream
// to the device carrying its datagrams both ways, ended after idle
// without one (see internal/flows).
type udpPort struct {
	*portBase
	pc       net.PacketConn
	srv      *flows.Server
	draining atomic.Bool // stopAccepting was called: no new flow starts
}

func newUDPPort(base *portBase, pc net.PacketConn, cfg flows.Config) *udpPort {
	p := &udpPort{portBase: base, pc: pc}
	p.srv = &flows.Server{
		Conn:    pc,
		Open:    p.openFlow,
		Admit:   p.admitFlow,
		Release: p.release,
		Config:  cfg,
	}
	p.wg.Go(func() { p.srv.Serve(p.ctx) })
	return p
}

// admitFlow decides whether a datagram from a new source starts a flow.
// It is asked for every datagram of a source that has none, so that what
// it refuses is not counted as refusals (a datagram is not a connection)
// and is logged at a bounded rate.
func (p *udpPort) admitFlow(src netip.AddrPort) bool {
	if p.draining.Load() {
		return false
	}
	return p.admit(src)
}

// openFlow opens the stream of a new flow from src, accounted for until
// the flow ends.
func (p *udpPort) openFlow(ctx context.Context, src netip.AddrPort) (net.Conn, error) {
	st, err := p.open.Open(ctx, p.target)
	if p.acct == nil {
		return st, err
	}
	if err != nil {
		p.refuse(src, reasonOf(err), err)
		return nil, err
	}
	fc := &flowConn{Conn: st}
	fc.tc = p.acct.Open(tcpconns.PortUDP, strconv.Itoa(p.m.Port), p.m.Target, src.String(), func() { st.Close() })
	return fc, nil
}

// stopAccepting keeps a UDP port open, since the flows running share its
// socket, but starts no new flow: a drain waits for the others.
func (p *udpPort) stopAccepting() { p.draining.Store(true) }

func (p *udpPort) stop() {
	p.cancel()
	p.pc.Close()
	p.wg.Wait()
}

// flowConn is a flow's stream, accounted for from its open to its close:
// the bytes each way (datagrams with their framing), and a refusal the
// device reports once the stream is used (the open costs no round trip).
type flowConn struct {
	net.Conn
	tc                   *tcpconns.Conn
	toDevice, fromDevice atomic.Int64

	mu     sync.Mutex // guards the fields below
	reason string     // the first refusal read or written, as tcpconns names it
	err    error
	closed bool
}

func (c *flowConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.fromDevice.Add(int64(n))
	c.note(err)
	return n, err
}

func (c *flowConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.toDevice.Add(int64(n))
	c.note(err)
	return n, err
}

func (c *flowConn) note(err error) {
	reason := connect.Reason(err)
	if reason == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reason == "" {
		c.reason, c.err = reason, err
	}
}

// Close closes the stream and accounts for the flow's end, once.
func (c *flowConn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	closed, reason, rerr := c.closed, c.reason, c.err
	c.closed = true
	c.mu.Unlock()
	if closed {
		return err
	}
	from := c.fromDevice.Load()
	if reason != "" && from == 0 {
		c.tc.Refused(reason, rerr)
		return err
	}
	c.tc.Close(c.toDevice.Load(), from)
	return err
}
