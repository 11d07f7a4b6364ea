// Package router makes a relay's routing decisions: where a user request
// goes (Fleet: this relay's agents, else one hop to the device's holder),
// where an arriving native agent belongs (Placer), and where a long-poll
// agent's poll or answer goes (Calls). On one relay a request reaches its
// device through the native tunnel when it has one, else its long-poll
// agents (Local).
//
// The router reads the fleet and this relay through small interfaces
// (Directory, Agents, Status, ...; see state.go), which package node fills
// with the fleet member, the tunnel pool, the broker and the watchdog. The
// decisions are tested as tables against fakes; docs/design/routing.md
// follows one request, one poll and one placement through the packages.
package router

import (
	"errors"
	"net/http"

	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// Local routes to the devices connected to this relay. It implements
// http.RoundTripper for requests whose URL host is the device name.
type Local struct {
	Native   *tunnel.Pool      // native tunnels
	LongPoll http.RoundTripper // the long-poll broker
}

var _ http.RoundTripper = (*Local)(nil)

// RoundTrip sends req over a native tunnel of its device when there is one,
// else through the long-poll agents.
func (l *Local) RoundTrip(req *http.Request) (*http.Response, error) {
	if l.Native.Has(req.URL.Host) {
		resp, err := l.Native.RoundTrip(req)
		if !errors.Is(err, tunnel.ErrNoSession) {
			return resp, err
		}
	}
	return l.LongPoll.RoundTrip(req)
}
