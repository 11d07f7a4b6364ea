package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// serviceDialTimeout bounds connecting to a service, TLS handshake
// included.
const serviceDialTimeout = 10 * time.Second

// services returns the agent's services: the one --backend gives, named
// service.Default, then the --service ones.
func (c *Config) services() ([]service.Service, error) {
	var list []service.Service
	if c.Backend != nil {
		b := *c.Backend
		if c.BackendH2C && b.Scheme == "http" {
			b.Scheme = "h2c"
		}
		b.RawQuery, b.Fragment = "", ""
		sv, err := service.FromURL(b.String())
		if err != nil {
			return nil, fmt.Errorf("--backend: %w", err)
		}
		sv.Name = service.Default
		list = append(list, sv)
	}
	for _, sv := range c.Services {
		for _, x := range list {
			if x.Name == sv.Name {
				return nil, fmt.Errorf("service %s is given twice (--backend is the service %q)", sv.Name, service.Default)
			}
		}
		list = append(list, sv)
	}
	return list, nil
}

// serveStreams serves a version 2 tunnel until it dies or ctx ends: each
// stream the relay opens names one of the agent's services, which the
// agent dials and joins to the stream byte for byte. It returns once every
// stream's copying has ended.
func (a *Agent) serveStreams(ctx context.Context, conn net.Conn) {
	l := a.cfg.Liveness.WithDefaults()
	ms := mux.New(conn, mux.Config{Client: true, MaxWindow: tunnel.MaxWindow, PingAfter: l.Interval, DeadAfter: l.Interval + l.Timeout})
	stop := context.AfterFunc(ctx, func() { ms.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ms.Close()
	for {
		st, err := ms.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { a.serveStream(ctx, st) })
	}
}

// serveStream dials the service st names and copies bytes both ways,
// passing each direction's end on as a half-close. A stream whose service
// is unknown or unreachable is reset with a code that tells the relay why.
func (a *Agent) serveStream(ctx context.Context, st *mux.Stream) {
	name := string(st.Meta())
	sv, ok := a.byName[name]
	if !ok {
		st.Reset(tunnel.CodeUnknownService)
		return
	}
	backend, err := a.dialService(ctx, sv)
	if err != nil {
		code := tunnel.CodeServiceUnreachable
		if errors.Is(err, syscall.ECONNREFUSED) {
			code = tunnel.CodeServiceRefused
		}
		a.cfg.Logger.Debug("service unreachable", "device", a.cfg.Device, "service", name, "err", err)
		st.Reset(code)
		return
	}
	join(st, backend)
}

// dialService connects to sv: TCP, then TLS when sv says so, verified with
// the agent's backend CAs.
func (a *Agent) dialService(ctx context.Context, sv service.Service) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, serviceDialTimeout)
	defer cancel()
	d := net.Dialer{KeepAlive: 15 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", sv.Addr)
	if err != nil || !sv.TLS {
		return conn, err
	}
	tc := &tls.Config{RootCAs: a.cfg.BackendRootCAs, ServerName: sv.ServerName, MinVersion: tls.VersionTLS12}
	if sv.Kind == service.HTTP {
		tc.NextProtos = []string{"http/1.1"} // the relay speaks HTTP/1.1 over the stream
	}
	t := tls.Client(conn, tc)
	if err := t.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("TLS with service at %s: %w", sv.Addr, err)
	}
	return t, nil
}

// halfCloser is a connection whose sending direction can end alone.
type halfCloser interface {
	CloseWrite() error
}

// join copies st to backend and backend to st until both directions have
// ended, then closes both. When either side fails (the relay reset the
// stream: the user went away), the other is closed at once.
func join(st *mux.Stream, backend net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := st.WriteTo(backend)
		if err != nil {
			backend.Close()
			return
		}
		if hc, ok := backend.(halfCloser); ok {
			hc.CloseWrite()
		}
	})
	buf := copyBuffers.Get().(*[32 << 10]byte)
	_, err := io.CopyBuffer(st, onlyReader{backend}, buf[:])
	copyBuffers.Put(buf)
	if err != nil {
		st.Reset(mux.CodeCancel)
		backend.Close()
	} else {
		st.CloseWrite()
	}
	wg.Wait()
	backend.Close()
	st.Close()
}

// onlyReader hides a connection's WriteTo, so that io.CopyBuffer reads
// into the given buffer and writes to the stream.
type onlyReader struct{ io.Reader }

// tunnelVersion returns the newest tunnel version the agent offers.
func (c *Config) tunnelVersion() int {
	if c.TunnelVersion == tunnel.V1 {
		return tunnel.V1
	}
	return tunnel.V2
}

// checkServices is Validate's part for --service.
func checkServices(c *Config) error {
	if _, err := c.services(); err != nil {
		return err
	}
	if c.TunnelVersion != 0 && c.TunnelVersion != tunnel.V1 && c.TunnelVersion != tunnel.V2 {
		return fmt.Errorf("tunnel version %d: use %d or %d", c.TunnelVersion, tunnel.V1, tunnel.V2)
	}
	return nil
}
