package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"github.com/switchboard-relay/switchboard/internal/logkey"
	"net"
	"slices"
	"time"

	"github.com/switchboard-relay/switchboard/internal/flows"
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
		sv.Broadcast = c.BroadcastPaths
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
	for _, name := range c.Passthrough {
		i := slices.IndexFunc(list, func(sv service.Service) bool { return sv.Name == name })
		switch {
		case i < 0:
			return nil, invalidf("Passthrough", "names %q, which is no service of the agent: give it with --service %s=tcp://HOST:PORT", name, name)
		case list[i].Kind != service.TCP || list[i].TLS:
			return nil, invalidf("Passthrough", "names %q, which is not a tcp:// service: passthrough carries the user's TLS to a service that terminates it, so give it as %s=tcp://HOST:PORT", name, name)
		}
		list[i].Passthrough = true
	}
	return list, nil
}

// dialStream connects to the service a stream names.
func (a *Agent) dialStream(ctx context.Context, name string) (net.Conn, error) {
	sv, ok := a.byName[name]
	if !ok {
		return nil, fmt.Errorf("service %q: %w", name, service.ErrUnknown)
	}
	conn, err := a.dialService(ctx, sv)
	if err != nil {
		a.cfg.Logger.Debug("service unreachable", logkey.Device, a.cfg.Device, logkey.Service, name, logkey.Err, err)
	}
	return conn, err
}

// dialService connects to sv: TCP, then TLS when sv says so, verified with
// the agent's backend CAs; for UDP, a socket connected to it, carrying
// one flow (internal/flows).
func (a *Agent) dialService(ctx context.Context, sv service.Service) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, serviceDialTimeout)
	defer cancel()
	d := net.Dialer{KeepAlive: 15 * time.Second}
	if sv.Kind == service.UDP {
		conn, err := d.DialContext(ctx, "udp", sv.Addr)
		if err != nil {
			return nil, err
		}
		log := a.cfg.Logger.With(logkey.Component, "udp", logkey.Device, a.cfg.Device, logkey.Service, sv.Name)
		return &flows.Socket{Conn: conn, Config: flows.Config{Logger: log, Lines: a.flowLines}}, nil
	}
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
		return invalidf("TunnelVersion", "%d is no tunnel version: use %d or %d", c.TunnelVersion, tunnel.V1, tunnel.V2)
	}
	return nil
}
