package flows

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"

	"github.com/switchboard-relay/switchboard/internal/datagram"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/lograte"
)

// Server carries a socket's datagrams, each source address a flow on a
// stream of its own.
type Server struct {
	// Conn is the socket; the server reads it until it is closed.
	Conn net.PacketConn
	// Open opens the stream of a new flow from src.
	Open func(ctx context.Context, src netip.AddrPort) (net.Conn, error)
	// Admit, if set, decides whether a new source may start a flow; a
	// source it refuses has its datagrams dropped until it asks again.
	// Release is called once for each admitted flow when it ends.
	Admit   func(src netip.AddrPort) bool
	Release func()
	Config

	mu    sync.Mutex // guards flows
	flows map[netip.AddrPort]*flow
}

// Serve reads the socket until it is closed, then ends every flow and
// waits for them. ctx ends the flows too (close Conn to end Serve).
func (s *Server) Serve(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if s.Lines == nil {
		s.Lines = lograte.New(lograte.DefaultPerSecond)
	}
	log := s.logger()
	buf := make([]byte, datagram.MaxSize+1) // one more: an oversized datagram shows
	for {
		n, addr, err := s.Conn.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Warn("reading stopped", logkey.Err, err)
			}
			return
		}
		ua, ok := addr.(*net.UDPAddr)
		if !ok {
			continue
		}
		src := ua.AddrPort()
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		f, start := s.flowOf(src)
		if f == nil {
			continue
		}
		if start {
			wg.Go(func() { s.serve(ctx, src, f) })
		}
		if f.offer(buf[:n]) {
			warnOversize(s.Config, logkey.Source, src)
		}
	}
}

// Flows returns how many flows are open.
func (s *Server) Flows() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.flows)
}

// flowOf returns the flow of src, and whether it is new and to be
// started; nil if src is new and not admitted.
func (s *Server) flowOf(src netip.AddrPort) (*flow, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.flows[src]; ok {
		return f, false
	}
	if s.Admit != nil && !s.Admit(src) {
		return nil, false
	}
	if s.flows == nil {
		s.flows = map[netip.AddrPort]*flow{}
	}
	f := newFlow(s.queue())
	s.flows[src] = f
	return f, true
}

// serve carries the flow of src until it ends.
func (s *Server) serve(ctx context.Context, src netip.AddrPort, f *flow) {
	defer func() {
		s.mu.Lock()
		delete(s.flows, src)
		s.mu.Unlock()
		if s.Release != nil {
			s.Release()
		}
	}()
	st, err := s.Open(ctx, src)
	if err != nil {
		s.info("flow refused", logkey.Source, src, logkey.Err, err)
		return
	}
	s.info("flow started", logkey.Source, src)
	to := net.UDPAddrFromAddrPort(src)
	err = f.carry(ctx, st, func(d []byte) error {
		_, err := s.Conn.WriteTo(d, to)
		return err
	}, s.idle())
	f.logEnd(s.Config, err, logkey.Source, src)
}
