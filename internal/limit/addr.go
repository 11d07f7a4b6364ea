package limit

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Key is what the limiter counts failures by: an IPv4 address (IPv4-mapped
// IPv6 included) as itself, an IPv6 address by its /64, since one host
// commonly holds a whole /64 and could otherwise step through it. Every
// invalid address (a client whose address is unknown) shares one key.
func Key(ip netip.Addr) netip.Prefix {
	ip = ip.Unmap().WithZone("")
	switch {
	case !ip.IsValid():
		return netip.Prefix{}
	case ip.Is4():
		return netip.PrefixFrom(ip, 32)
	default:
		return netip.PrefixFrom(ip, 64).Masked()
	}
}

// ClientIP returns the address of the client that sent r: the host of
// r.RemoteAddr. X-Forwarded-For is believed only when the connection comes
// from one of trusted (the relay's own load balancers or reverse proxies):
// then the client is the rightmost address in it that is not itself
// trusted, as each trusted proxy appends the address it was reached from
// and only those appends can be relied on. With trusted empty, the header
// is ignored: anyone can write it. It returns the zero Addr when the address
// cannot be read (a listener that is not TCP); Key puts all such clients
// under one key.
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	ip := remoteIP(r.RemoteAddr)
	if !isTrusted(ip, trusted) {
		return ip
	}
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		parts := strings.Split(hops[i], ",")
		for j := len(parts) - 1; j >= 0; j-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(parts[j]))
			if err != nil {
				return ip // a hop we cannot read: stop at the last proxy we trust
			}
			if ip = hop.Unmap(); !isTrusted(ip, trusted) {
				return ip
			}
		}
	}
	return ip
}

// remoteIP parses the address part of a RemoteAddr ("203.0.113.9:5678",
// "[2001:db8::1]:5678").
func remoteIP(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().Unmap()
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return ip.Unmap()
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	if !ip.IsValid() {
		return false
	}
	ip = ip.WithZone("")
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
