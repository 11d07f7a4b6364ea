// Package connect carries users' TCP connections to devices' services:
// `switchboard connect` on the user's machine keeps one long-lived
// connection to the fleet's public URL (an HTTP/1.1 Upgrade to
// switchboard-connect/1, which plain HTTP proxies pass), multiplexed, and
// each of its local connections is one stream on it, opened without a
// round trip. The relay authorizes the credential once, at the upgrade,
// and each stream's device and service as it opens.
//
//	client side: c := connect.NewClient(cfg); conn, err := c.Dial(ctx, target)
//	relay side:  &connect.Handler{Open: opener, Authorize: authz}
package connect

import (
	"errors"
	"fmt"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"
)

// Protocol names the connection in the Upgrade header.
const Protocol = "switchboard-connect/1"

// Path is the relay endpoint the client opens its connection on.
const Path = "/switchboard/connect"

// Target names a device's service: DEVICE/SERVICE, and how it is
// reached.
type Target struct {
	Device, Service string
	// Network is how the stream reaches the service: TCP ("" too) carries
	// bytes to a tcp:// or tls:// service; UDP carries datagrams
	// (internal/datagram's framing) to a udp:// one; Passthrough carries
	// a user's TLS connection, by SNI and without a credential, to a
	// tcp:// service its device offers for passthrough.
	Network string
}

// Networks of a Target.
const (
	TCP         = "tcp"
	UDP         = "udp"
	Passthrough = "passthrough"
)

// String returns DEVICE/SERVICE.
func (t Target) String() string { return t.Device + "/" + t.Service }

// kind is how the relay accounts for a stream to t (internal/tcpconns):
// a UDP flow apart from TCP connections.
func (t Target) kind() tcpconns.Kind {
	if t.Network == UDP {
		return tcpconns.ConnectUDP
	}
	return tcpconns.Connect
}

// meta is what names the target on a stream: DEVICE/SERVICE for TCP,
// DEVICE/SERVICE/NETWORK for the others.
func (t Target) meta() string {
	if t.Network == "" || t.Network == TCP {
		return t.String()
	}
	return t.String() + "/" + t.Network
}

// parseMeta reads what meta wrote.
func parseMeta(s string) (Target, error) {
	network := TCP
	if i := strings.LastIndexByte(s, '/'); i > 0 && strings.Count(s, "/") == 2 {
		s, network = s[:i], s[i+1:]
		if network != UDP && network != Passthrough {
			return Target{}, fmt.Errorf("%q: no such network: use %s or %s", network, UDP, Passthrough)
		}
	}
	t, err := ParseTarget(s)
	t.Network = network
	return t, err
}

// ParseTarget reads DEVICE/SERVICE.
func ParseTarget(s string) (Target, error) {
	device, svc, ok := strings.Cut(s, "/")
	if !ok || device == "" || svc == "" || strings.ContainsAny(device, "/ \x00") {
		return Target{}, fmt.Errorf("%q: name a device's service as DEVICE/SERVICE, e.g. robot-1/ssh", s)
	}
	if err := service.CheckName(svc); err != nil {
		return Target{}, err
	}
	return Target{Device: device, Service: svc}, nil
}

// Errors a stream can end with, before any byte of the service's: the
// relay sends them as the stream's reset code, the client reads them
// back. Openers and authorizers return them (wrapped) to choose the code.
var (
	ErrNoDevice       = errors.New("the device is not connected to the fleet")
	ErrUnknownService = errors.New("the device has no such service")
	ErrForbidden      = errors.New("the credential does not allow this device or service")
	ErrRefused        = errors.New("the device's service refused the connection")
	ErrUnreachable    = errors.New("the device's service could not be reached")
	ErrBusy           = errors.New("too many connections: try again later")
)

// codes pairs each error with its reset code.
var codes = []struct {
	code uint32
	err  error
}{
	{mux.CodeApplication + 1, ErrNoDevice},
	{mux.CodeApplication + 2, ErrUnknownService},
	{mux.CodeApplication + 3, ErrForbidden},
	{mux.CodeApplication + 4, ErrRefused},
	{mux.CodeApplication + 5, ErrUnreachable},
	{mux.CodeApplication + 6, ErrBusy},
}

// Reason names err's kind as the refusals metric labels it
// (tcpconns.Reason…), or returns "" when err is none of the errors above.
func Reason(err error) string {
	for _, r := range []struct {
		err    error
		reason string
	}{
		{ErrNoDevice, tcpconns.ReasonNoDevice},
		{ErrUnknownService, tcpconns.ReasonUnknownService},
		{ErrForbidden, tcpconns.ReasonForbidden},
		{ErrRefused, tcpconns.ReasonRefused},
		{ErrUnreachable, tcpconns.ReasonUnreachable},
		{ErrBusy, tcpconns.ReasonBusy},
	} {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return ""
}

// codeOf returns the reset code for err: ErrUnreachable's for errors of
// no known kind.
func codeOf(err error) uint32 {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return mux.CodeApplication + 5
}

// errorOf turns a stream's failure back into one of the errors above, or
// returns it as it is.
func errorOf(err error) error {
	var re *mux.ResetError
	if !errors.As(err, &re) || !re.Remote {
		return err
	}
	for _, c := range codes {
		if c.code == re.Code {
			return c.err
		}
	}
	return err
}
