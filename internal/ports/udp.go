package ports

import (
	"context"
	"net"
	"net/netip"

	"github.com/switchboard-relay/switchboard/internal/flows"
)

// udpPort is a mapped UDP port. Each source address is a flow: one stream
// to the device carrying its datagrams both ways, ended after idle
// without one (see internal/flows).
type udpPort struct {
	*portBase
	pc  net.PacketConn
	srv *flows.Server
}

func newUDPPort(base *portBase, pc net.PacketConn, cfg flows.Config) *udpPort {
	p := &udpPort{portBase: base, pc: pc}
	p.srv = &flows.Server{
		Conn: pc,
		Open: func(ctx context.Context, _ netip.AddrPort) (net.Conn, error) {
			return p.open.Open(ctx, p.target)
		},
		Admit:   p.admit,
		Release: p.release,
		Config:  cfg,
	}
	p.wg.Go(func() { p.srv.Serve(p.ctx) })
	return p
}

// stopAccepting keeps a UDP port open: flows have no accept to stop, and
// end with the port.
func (p *udpPort) stopAccepting() {}

func (p *udpPort) stop() {
	p.cancel()
	p.pc.Close()
	p.wg.Wait()
}
