// Package proxyproto writes and reads the PROXY protocol's version 2
// header (HAProxy's proxy-protocol.txt): the few bytes a proxy sends
// before a connection's own, so that the server behind it learns the
// client's address. A relay sends it to a device's service that asks for
// it, and reads it from an L4 balancer in front of the relay.
package proxyproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// signature opens every version 2 header.
var signature = []byte("\r\n\r\n\x00\r\nQUIT\n")

const (
	versionCommandProxy = 0x21 // version 2, PROXY: addresses follow
	versionCommandLocal = 0x20 // version 2, LOCAL: the proxy's own connection (health checks)

	familyTCP4 = 0x11
	familyUDP4 = 0x12
	familyTCP6 = 0x21
	familyUDP6 = 0x22

	// MaxHeader bounds a header's length as read: addresses and TLVs.
	MaxHeader = 1024
)

// Header is what a header says.
type Header struct {
	// Local is set for a LOCAL header: the connection is the proxy's own,
	// and Source and Destination are not given.
	Local               bool
	UDP                 bool
	Source, Destination netip.AddrPort
}

// Append appends the header for a connection from src to dst, both IPv4
// or both IPv6 (an IPv4-mapped IPv6 address counts as IPv4).
func Append(b []byte, h Header) ([]byte, error) {
	b = append(b, signature...)
	if h.Local {
		return append(b, versionCommandLocal, 0, 0, 0), nil
	}
	src, dst := h.Source.Addr().Unmap(), h.Destination.Addr().Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("proxy protocol: addresses %v and %v are not of one family", h.Source, h.Destination)
	}
	family := byte(familyTCP4)
	switch {
	case src.Is4() && h.UDP:
		family = familyUDP4
	case !src.Is4() && h.UDP:
		family = familyUDP6
	case !src.Is4():
		family = familyTCP6
	}
	length := 12
	if !src.Is4() {
		length = 36
	}
	b = append(b, versionCommandProxy, family)
	b = binary.BigEndian.AppendUint16(b, uint16(length))
	b = append(b, src.AsSlice()...)
	b = append(b, dst.AsSlice()...)
	b = binary.BigEndian.AppendUint16(b, h.Source.Port())
	b = binary.BigEndian.AppendUint16(b, h.Destination.Port())
	return b, nil
}

// ErrNoHeader means the connection does not start with a version 2 header.
var ErrNoHeader = errors.New("proxy protocol: no version 2 header")

// Read reads a header from r. It reads nothing past the header, and fails
// with ErrNoHeader, having consumed nothing, if the bytes there are not
// one.
func Read(r *bufio.Reader) (Header, error) {
	start, err := r.Peek(16)
	if err != nil {
		if bytes.HasPrefix(signature, start) && len(start) > 0 {
			return Header{}, fmt.Errorf("proxy protocol: header cut short: %w", io.ErrUnexpectedEOF)
		}
		return Header{}, ErrNoHeader
	}
	if !bytes.Equal(start[:12], signature) {
		return Header{}, ErrNoHeader
	}
	vc, family := start[12], start[13]
	length := int(binary.BigEndian.Uint16(start[14:16]))
	if length > MaxHeader {
		return Header{}, fmt.Errorf("proxy protocol: header of %d bytes, over the limit of %d", length, MaxHeader)
	}
	if vc != versionCommandProxy && vc != versionCommandLocal {
		return Header{}, fmt.Errorf("proxy protocol: version and command %#x, want 0x21 or 0x20", vc)
	}
	if _, err := r.Discard(16); err != nil {
		return Header{}, err
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		return Header{}, fmt.Errorf("proxy protocol: header cut short: %w", err)
	}
	if vc == versionCommandLocal {
		return Header{Local: true}, nil
	}
	var h Header
	var alen int
	switch family {
	case familyTCP4, familyUDP4:
		alen = 4
	case familyTCP6, familyUDP6:
		alen = 16
	default:
		// UNSPEC or UNIX: the addresses mean nothing to us; the spec
		// says to treat such a connection as the proxy's own.
		return Header{Local: true}, nil
	}
	h.UDP = family == familyUDP4 || family == familyUDP6
	if len(body) < 2*alen+4 {
		return Header{}, fmt.Errorf("proxy protocol: %d bytes of addresses, want %d", len(body), 2*alen+4)
	}
	src, _ := netip.AddrFromSlice(body[:alen])
	dst, _ := netip.AddrFromSlice(body[alen : 2*alen])
	h.Source = netip.AddrPortFrom(src, binary.BigEndian.Uint16(body[2*alen:]))
	h.Destination = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(body[2*alen+2:]))
	return h, nil // TLVs, if any, are skipped
}
