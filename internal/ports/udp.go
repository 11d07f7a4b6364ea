package ports

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/datagram"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// udpPort is a mapped UDP port. Each source address is a flow: one stream
// to the device carrying its datagrams both ways, ended after idle
// without one.
type udpPort struct {
	*portBase
	pc    net.PacketConn
	idle  time.Duration
	queue int

	fmu   sync.Mutex // guards flows
	flows map[netip.AddrPort]*flow
}

// flow is one source's datagrams.
type flow struct {
	src  netip.AddrPort
	in   chan []byte // datagrams for the device; full: dropped
	last time.Time   // the last datagram either way, under the port's fmu
}

// stopAccepting keeps a UDP port open: flows have no accept to stop, and
// end with the port.
func (p *udpPort) stopAccepting() {}

func (p *udpPort) stop() {
	p.cancel()
	p.pc.Close()
	p.closeConns()
	p.wg.Wait()
}

func (p *udpPort) read() {
	buf := make([]byte, datagram.MaxSize)
	for {
		n, addr, err := p.pc.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.Warn("reading stopped", logkey.Err, err)
			}
			return
		}
		src := netip.MustParseAddrPort(addr.String())
		f := p.flowOf(src)
		if f == nil {
			continue
		}
		select {
		case f.in <- append([]byte(nil), buf[:n]...):
		default: // the device's side is behind: drop, as UDP may
		}
	}
}

// flowOf returns the flow of src, starting it if it is new and admitted.
func (p *udpPort) flowOf(src netip.AddrPort) *flow {
	p.fmu.Lock()
	defer p.fmu.Unlock()
	if f, ok := p.flows[src]; ok {
		f.last = time.Now()
		return f
	}
	if !p.admit(src) {
		return nil
	}
	f := &flow{src: src, in: make(chan []byte, p.queue), last: time.Now()}
	p.flows[src] = f
	p.wg.Go(func() {
		defer p.release()
		p.serve(f)
	})
	return f
}

// serve carries one flow until it is idle for p.idle or the port closes.
func (p *udpPort) serve(f *flow) {
	defer func() {
		p.fmu.Lock()
		delete(p.flows, f.src)
		p.fmu.Unlock()
	}()
	dev, err := p.open.Open(p.ctx, p.target)
	if err != nil {
		p.log.Info("flow refused", logkey.Source, f.src, logkey.Err, err)
		return
	}
	p.track(dev)
	defer p.untrack(dev)
	defer dev.Close()
	p.log.Info("flow started", logkey.Source, f.src)
	p.wg.Go(func() { p.answer(f, dev) }) // ends when dev closes
	w := datagram.NewWriter(dev)
	timer := time.NewTimer(p.idle)
	defer timer.Stop()
	for {
		select {
		case d := <-f.in:
			if _, err := w.Write(d); err != nil {
				return
			}
		case <-timer.C:
			p.fmu.Lock()
			idleFor := time.Since(f.last)
			p.fmu.Unlock()
			if idleFor >= p.idle {
				p.log.Info("flow ended: idle", logkey.Source, f.src)
				return
			}
			timer.Reset(p.idle - idleFor)
		case <-p.ctx.Done():
			return
		}
	}
}

// answer sends the device's datagrams back to the flow's source.
func (p *udpPort) answer(f *flow, dev net.Conn) {
	r := datagram.NewReader(dev)
	buf := make([]byte, datagram.MaxSize)
	to := net.UDPAddrFromAddrPort(f.src)
	for {
		n, err := r.Read(buf)
		if err != nil && !errors.Is(err, errShortBuffer) {
			dev.Close()
			return
		}
		p.fmu.Lock()
		f.last = time.Now()
		p.fmu.Unlock()
		p.pc.WriteTo(buf[:n], to)
	}
}

var errShortBuffer = io.ErrShortBuffer
