package flows

import (
	"context"
	"errors"
	"net"
	"syscall"

	"github.com/switchboard-relay/switchboard/internal/datagram"
)

// Join carries one flow between st and a UDP socket connected to the
// service (a device's agent: one socket per stream), until the flow is
// idle, ctx ends, or either side fails. It closes both and returns why
// the flow ended (ErrIdle for idle; datagram.ErrTooLarge when st sent a
// frame over the limit).
func Join(ctx context.Context, st net.Conn, svc net.Conn, cfg Config) error {
	f := newFlow(cfg.queue())
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, datagram.MaxSize+1) // one more: an oversized datagram shows
		for {
			n, err := svc.Read(buf)
			if err != nil {
				if errors.Is(err, syscall.ECONNREFUSED) {
					continue // an ICMP port unreachable: UDP goes on
				}
				return
			}
			if f.offer(buf[:n]) {
				warnOversize(cfg)
			}
		}
	}()
	err := f.carry(ctx, st, func(d []byte) error {
		if _, err := svc.Write(d); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
		return nil
	}, cfg.idle())
	svc.Close()
	<-done
	f.logEnd(cfg, err)
	return err
}

// Socket is a UDP socket connected to a service, with its flow's bounds:
// what an agent dials for a udp:// service, so that the stream that
// named the service is joined to it with Join.
type Socket struct {
	net.Conn
	Config Config
}
