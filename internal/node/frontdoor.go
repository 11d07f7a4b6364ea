package node

import (
	"net/http"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/relay"
)

// sendBackEvery is how often at most a relay asks for one device's agents
// to be sent back through the front door, so that a front door that does
// not hash after all (or two that disagree) moves a device once per this
// window, not on every request.
const sendBackEvery = 10 * time.Second

// maxSendBacks bounds the devices whose last ask is remembered.
const maxSendBacks = 1 << 14

// sendBacks remembers when this relay last asked for each device's agents.
type sendBacks struct {
	mu   sync.Mutex // guards last
	last map[string]time.Time
}

// due reports whether device may be asked for now, and notes the ask.
func (s *sendBacks) due(device string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.last[device]; ok && now.Sub(t) < sendBackEvery {
		return false
	}
	if s.last == nil || len(s.last) >= maxSendBacks {
		s.pruneLocked(now)
	}
	s.last[device] = now
	return true
}

// pruneLocked forgets the asks older than the window, or all of them when
// too many are recent.
func (s *sendBacks) pruneLocked(now time.Time) {
	if s.last == nil {
		s.last = map[string]time.Time{}
		return
	}
	for d, t := range s.last {
		if now.Sub(t) >= sendBackEvery {
			delete(s.last, d)
		}
	}
	if len(s.last) >= maxSendBacks {
		clear(s.last)
	}
}

// frontDoorTransport wraps the fleet router for relays behind a front door
// that hashes on the device (KeepArrivingAgents): a user's request that
// entered here for a device whose agents are on another relay says that
// the front door now sends the device here, for instance because this
// relay came back after a failure while the agents stayed where they had
// moved. This relay asks the holder to send the agents back through the
// front door, which brings them here, and forwards the request as usual
// meanwhile.
func (n *Node) frontDoorTransport(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if hops, _ := relay.Hops(req.Context()); hops == 0 {
			n.askBack(req.URL.Host)
		}
		return next.RoundTrip(req)
	})
}

// askBack asks the relay holding device to send its agents back through
// the front door, unless this relay has an agent of it, is leaving, or
// asked within sendBackEvery.
func (n *Node) askBack(device string) {
	if n.router.HasAgent(device) || n.member.ShouldDrain() || n.stopping.Load() {
		return
	}
	t, ok := n.member.Route(device, n.cfg.Region, n.forwardVetoed, "")
	if !ok || t.Self || !n.backs.due(device, time.Now()) {
		return
	}
	n.member.SendBack(device, t.ID)
}

// sentBack sends device's native agents back through the front door, as
// relay by asked: they reconnect there, and the front door sends them to
// by. Streams in flight finish first.
func (n *Node) sentBack(device, by string) {
	if k := n.tunnels.DrainDevice(device); k > 0 {
		n.log.Info("agents sent back through the front door", logkey.Device, device, logkey.By, by, logkey.Tunnels, k)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
