package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/fleetsecret"
	"github.com/switchboard-relay/switchboard/internal/topic"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// local is the relay's own state as its fleet member reports it.
type local struct{ n *Node }

// Presence merges the devices with native tunnels and with long-poll agents.
func (l local) Presence() map[string]fleet.Presence {
	out := map[string]fleet.Presence{}
	for d, k := range l.n.tunnels.Presence() {
		out[d] = fleet.Presence{Agents: k, Protocol: "native"}
	}
	for d, k := range l.n.broker.Presence() {
		p, ok := out[d]
		p.Agents += k
		p.Protocol = "longpoll"
		if ok {
			p.Protocol = "native+longpoll"
		}
		out[d] = p
	}
	return out
}

func (l local) AgentSessions() int {
	n := l.n.tunnels.Sessions()
	for _, k := range l.n.broker.Presence() {
		n += k
	}
	return n
}

func (l local) Healthy() bool  { return l.n.healthy.Load() }
func (l local) Stopping() bool { return l.n.stopping.Load() }

// loadRelayID derives the relay's id from its configured name, or reads it
// from the data dir, minting it on first start.
func (n *Node) loadRelayID() error {
	if n.cfg.RelayName != "" {
		n.relayID = fleet.RelayIDFromName(n.cfg.RelayName)
		n.log.Info("relay id derived from the relay's name", logkey.RelayID, n.relayID, logkey.Name, n.cfg.RelayName)
		return nil
	}
	id, created, err := fleet.LoadOrCreateRelayID(n.cfg.DataDir)
	if err != nil {
		return err
	}
	if created {
		n.log.Info("minted a relay id", logkey.RelayID, id, logkey.Path, filepath.Join(n.cfg.DataDir, fleet.RelayIDFile))
	}
	n.relayID = id
	return nil
}

// openFleet loads the fleet secret, enrols the relay and starts its fleet
// member, and then the keeper of the secret beside it.
func (n *Node) openFleet(ctx context.Context) error {
	var err error
	host, _ := os.Hostname()
	sc := n.cfg.FleetSecret
	sc.RelayID, sc.Interval, sc.Logger = n.relayID, n.cfg.Fleet.BeatInterval, n.log
	if n.fleetSecret, err = fleetsecret.Open(ctx, n.store, sc); err != nil {
		return fmt.Errorf("join the fleet state: %w", err)
	}
	fc := n.cfg.Fleet
	fc.Secret = n.fleetSecret
	fc.RelayID, fc.Hostname, fc.Region, fc.Version = n.relayID, host, n.cfg.Region, n.cfg.Version
	fc.Addresses = []string{n.advertise(host)}
	fc.Local = local{n}
	fc.Logger = n.log
	fc.OnCancel = n.cancelDevice
	fc.OnSendBack = n.sentBack
	fc.OnChange = n.changes.signal
	fc.OnShouldDrain = n.onShouldDrain
	fc.OnMove = fleet.NewFailoverMetrics(n.registry).Observe
	fc.Standbys = n.tunnels.Standbys
	fc.OnPromote = n.onPromote
	fc.OnRecordedHere = n.onRecordedHere
	fc.OnHandOver = n.handOver
	fc.Answering = n.answering
	n.healthy.Store(true)
	if n.member, err = fleet.Open(ctx, n.store, fc); err != nil {
		return fmt.Errorf("join the fleet state: %w", err)
	}
	n.tunnels.OnChange = func() {
		n.member.Changed()
		n.changes.signal()
	}
	n.fleetSecret.Start(n.member)
	n.member.RegisterMetrics(n.registry)
	n.fleetSecret.RegisterMetrics(n.registry)
	return nil
}

// advertise is the URL other relays and agents use to reach this relay:
// Config.Advertise, or one derived from the public listener, https:// when
// it serves TLS.
func (n *Node) advertise(hostname string) string {
	if n.cfg.Advertise != "" {
		return n.cfg.Advertise
	}
	addr := n.publicLn.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = hostname
		if host == "" {
			host = "127.0.0.1"
		}
	}
	scheme := "http://"
	if n.publicTLS != nil {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// Fleet returns the relay's fleet member.
func (n *Node) Fleet() *fleet.Member { return n.member }

// FleetSecret returns the keeper of the relay's fleet secret.
func (n *Node) FleetSecret() *fleetsecret.Keeper { return n.fleetSecret }

// NATSURL returns the URL at which this node's embedded NATS server accepts
// other relays (with --nats-listen), or "" when it accepts none.
func (n *Node) NATSURL() string { return n.store.ClientURL() }

// Config returns the node's completed configuration.
func (n *Node) Config() Config { return n.cfg }

// movable reports whether a relay other than this one would take device's
// agent now: one that is fresh, healthy, not draining and not vetoed by
// this relay's watchdog.
func (n *Node) movable(device string) bool {
	t, ok := n.member.Holder(device, n.cfg.Region, n.placeVetoed, "")
	return ok && !t.Self
}

// cancelDevice drops the sessions of device on this relay. An operator's
// cancel cuts everything, requests in flight included. A device that moved
// to another relay (split affinity) loses its tunnels that still take
// requests and its waiting polls, so that its agents reconnect and land on
// the new holder; requests in flight finish.
func (n *Node) cancelDevice(device, reason string, moved bool) {
	tunnels := n.tunnels.CloseDevice(device)
	requests, topics := 0, 0
	if moved {
		n.broker.ForgetDevice(device)
		topics = n.topics.Moved(device)
	} else {
		requests = n.broker.CancelDevice(device, fmt.Errorf("the sessions of device %q were cancelled: %s", device, reason))
		topics = n.topics.CloseDevice(device, topic.ErrCancelled) + n.fanoutHub.CloseDevice(device, topic.ErrCancelled)
	}
	if tunnels > 0 || requests > 0 || topics > 0 {
		n.log.Info("device sessions dropped", logkey.Device, device, logkey.Tunnels, tunnels, logkey.Requests, requests, logkey.TopicConns, topics, logkey.Reason, reason)
	}
	n.member.Changed()
}

// onShouldDrain reacts to an operator's drain of this relay: its native
// agents are asked to go, spread over DrainSpread, and are placed on other
// relays as they reconnect; streams in flight finish first. An agent whose
// device no other relay would take now (this relay's watchdog vetoes the
// rest) stays until one would. Long-poll
// agents move by themselves: their next polls go to the device's new
// holder. An undrain moves nothing back.
func (n *Node) onShouldDrain(draining bool) {
	if !draining {
		n.tunnels.StopDraining()
		n.forgetFlips()
		return
	}
	n.tunnels.CloseStandbys()
	flipped := n.flipAll()
	k := n.tunnels.DrainSessions(n.cfg.DrainSpread, n.drainMovable(n.movable))
	n.log.Info("moving this relay's native agents to other relays", logkey.Tunnels, k, logkey.Spread, n.cfg.DrainSpread, logkey.Standbys, flipped)
}
