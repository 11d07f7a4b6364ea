// Package ports maps the fleet's public ports to devices' services. The
// mappings live in NATS, a key per port, and every relay mirrors them and
// listens on each mapped port, so that whichever relay an L4 balancer or
// a VIP picks accepts the connection and carries it to the device, one
// hop to the relay holding it as for HTTP.
//
//	st, err := ports.OpenStore(ctx, kv, log)   // the mappings
//	l := &ports.Listeners{Host: host, Open: opener}
//	st.OnChange(func() { l.Apply(st.List()) }) // listen on each
package ports

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/switchboard-relay/switchboard/internal/connect"
)

// Networks a port is mapped on.
const (
	TCP = "tcp"
	UDP = "udp"
)

// Mapping maps one port of every relay to a device's service.
type Mapping struct {
	Port    int    `json:"port"`
	Network string `json:"network"` // TCP or UDP
	// Target is DEVICE/SERVICE.
	Target string `json:"target"`
	// Allow, if set, lists the source prefixes (CIDR) that may connect;
	// others are closed at once.
	Allow []string `json:"allow,omitempty"`
	// MaxConns bounds the connections (UDP: flows) open at once through
	// one relay; 0 means no bound.
	MaxConns int `json:"max_connections,omitempty"`
	// ProxyProtocol sends the service a PROXY protocol v2 header first,
	// so that it learns the user's address.
	ProxyProtocol bool      `json:"proxy_protocol,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	CreatedBy     string    `json:"created_by,omitempty"`
}

// Key is the mapping's key in the bucket: "tcp-2222".
func (m Mapping) Key() string { return Key(m.Network, m.Port) }

// Key names a port of a network in the bucket.
func Key(network string, port int) string { return network + "-" + strconv.Itoa(port) }

// Errors of the mappings, for the operator API to answer.
var (
	// ErrMapped means the port is mapped already (409).
	ErrMapped = errors.New("the port is mapped already: remove its mapping first")
	// ErrNotMapped means no mapping of the port exists (404).
	ErrNotMapped = errors.New("the port is not mapped")
	// ErrInvalid wraps what is wrong with a mapping (400).
	ErrInvalid = errors.New("invalid port mapping")
)

// Validate reports what is wrong with m, wrapping ErrInvalid.
func (m Mapping) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if m.Port < 1 || m.Port > 65535 {
		return bad("port %d: use 1 to 65535", m.Port)
	}
	if m.Network != TCP && m.Network != UDP {
		return bad("network %q: use tcp or udp", m.Network)
	}
	if _, err := connect.ParseTarget(m.Target); err != nil {
		return bad("%v", err)
	}
	if _, err := m.prefixes(); err != nil {
		return bad("%v", err)
	}
	if m.MaxConns < 0 {
		return bad("max connections %d: use 0 (no bound) or more", m.MaxConns)
	}
	if m.ProxyProtocol && m.Network == UDP {
		return bad("the PROXY protocol header is for tcp ports")
	}
	return nil
}

func (m Mapping) prefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range m.Allow {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("allow %q: want a CIDR prefix such as 192.0.2.0/24, or an address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// allows reports whether a source address may connect.
func allows(prefixes []netip.Prefix, addr netip.Addr) bool {
	if len(prefixes) == 0 {
		return true
	}
	addr = addr.Unmap()
	for _, p := range prefixes {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
