// Package router decides how a user request reaches its device. On one relay
// that is the device's native tunnel when it has one, else its long-poll
// agents.
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
