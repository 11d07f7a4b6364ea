package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
)

// A standby tunnel (ProtocolStandby) is a version 2 session that the
// relay keeps for a device whose tunnel is on another relay: apart from
// the tunnels, out of Presence, Ready and every request, until the relay
// promotes it (Promote), when it joins the device's tunnels and its agent
// is told on a stream of its own (PromotedMeta). See
// docs/design/hot-standby.md.

// PromotedMeta prefixes the metadata of the stream a relay opens on a
// standby tunnel it promotes; the id of the relay the agent should keep
// its next standby at follows after a space (or nothing, for none). The
// agent answers the stream with a reset.
const PromotedMeta = "@promoted"

// SuggestMeta prefixes the metadata of the stream a holder opens on a
// tunnel whose agent keeps no standby, to name the relay it may keep one
// at now, as "<id>=<url>" after a space: a relay that became available
// after the agent connected, and so is in no list the agent has. The
// agent answers the stream with a reset.
const SuggestMeta = "@standby"

// Suggested reports whether meta, a stream's metadata, suggests a
// standby, and returns the relay it names.
func Suggested(meta string) (RelayAddr, bool) {
	rest, ok := strings.CutPrefix(meta, SuggestMeta+" ")
	if !ok {
		return RelayAddr{}, false
	}
	rs := ParseRelays(rest)
	if len(rs) != 1 || !validHeaderToken(rs[0].ID) {
		return RelayAddr{}, false
	}
	return rs[0], true
}

// ErrPromotionNoted is what an agent's service dialler returns for the
// promotion's stream: there is no service behind it.
var ErrPromotionNoted = errors.New("promotion noted")

// Promoted reports whether meta, a stream's metadata, is a promotion, and
// returns the next standby it names.
func Promoted(meta string) (next string, ok bool) {
	rest, ok := strings.CutPrefix(meta, PromotedMeta)
	if !ok || rest != "" && rest[0] != ' ' {
		return "", false
	}
	next = strings.TrimSpace(rest)
	if !validHeaderToken(next) {
		next = ""
	}
	return next, true
}

// promotedSignalTimeout bounds how long the relay waits for the agent's
// answer to a promotion's stream before closing it.
const promotedSignalTimeout = 10 * time.Second

// PingHeader says, in a version 2 (or standby) handshake, after how many
// milliseconds of silence the agent pings: an agent that leaves detection
// to the fleet pings seldom, and the relay then pings it no sooner than
// twice that (AddV2Paced), so that an idle tunnel costs a ping and its
// answer every agent interval.
const PingHeader = "X-Switchboard-Ping-Ms"

// maxAgentPing bounds the ping interval a relay takes from an agent.
const maxAgentPing = 10 * time.Minute

// AgentPing returns the ping interval r's agent announced (PingHeader),
// or 0 when it announced none or nonsense.
func AgentPing(r *http.Request) time.Duration {
	ms, err := strconv.ParseInt(r.Header.Get(PingHeader), 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return min(time.Duration(ms)*time.Millisecond, maxAgentPing)
}

// newV2Session starts a version 2 session on conn whose agent pings after
// agentPing of silence (0: the pool's interval): the relay pings after
// twice the longer of the two, and gives the agent up half the pool's
// timeout later. gone runs once the session has ended, before Done closes.
func (p *Pool) newV2Session(conn net.Conn, device, agentID, instance string, services map[string]service.Announced, agentPing time.Duration, gone func(*Session)) *Session {
	every := max(p.live.Interval, agentPing)
	ms := mux.New(conn, mux.Config{
		RefuseStreams: true,      // the agent opens nothing
		OnGoAway:      p.changed, // the agent retires it: requests waiting look elsewhere
		MaxWindow:     MaxWindow,
		PingAfter:     2 * every,
		DeadAfter:     2*every + p.live.Timeout/2,
	})
	s := &Session{Device: device, AgentID: agentID, Instance: instance, Version: V2, paced: agentPing > 0, pool: p, done: make(chan struct{})}
	s.c = newMuxCarrier(device, ms, services)
	// What the session's end must do runs when it ends: no goroutine
	// waits for it meanwhile, whose stack ten thousand idle agents would
	// pay for.
	p.watchers.Add(1)
	ms.AfterFunc(func() {
		defer p.watchers.Done()
		s.c.close()
		gone(s)
		close(s.done)
	})
	return s
}

// AddV2Paced is AddV2 for an agent that announced it pings after
// agentPing of silence (PingHeader).
func (p *Pool) AddV2Paced(conn net.Conn, device, agentID, instance string, services map[string]service.Announced, agentPing time.Duration) (*Session, error) {
	return p.join(p.newV2Session(conn, device, agentID, instance, services, agentPing, p.remove))
}

// AddStandby starts a version 2 session on an accepted standby tunnel
// connection, whose agent pings after agentPing of silence, and keeps it
// apart, as a standby for device. It leaves by itself when its connection
// dies.
func (p *Pool) AddStandby(conn net.Conn, device, agentID, instance string, services map[string]service.Announced, agentPing time.Duration) (*Session, error) {
	s := p.newV2Session(conn, device, agentID, instance, services, agentPing, func(s *Session) {
		p.dropStandby(s)
		p.remove(s)
	})
	p.mu.Lock()
	if s.gone {
		p.mu.Unlock()
		return nil, errors.New("the standby tunnel closed as it opened")
	}
	if p.standby == nil {
		p.standby = make(map[string][]*Session)
	}
	p.standby[device] = append(p.standby[device], s)
	p.mu.Unlock()
	p.changed()
	p.log.Debug("standby tunnel connected", logkey.Device, device, logkey.Instance, instance)
	return s, nil
}

// dropStandby takes s out of the standbys, if it is one.
func (p *Pool) dropStandby(s *Session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.standby[s.Device]
	for i, x := range list {
		if x == s {
			list = append(list[:i:i], list[i+1:]...)
			if len(list) == 0 {
				delete(p.standby, s.Device)
			} else {
				p.standby[s.Device] = list
			}
			return
		}
	}
}

// Standbys counts the standby tunnels of each device.
func (p *Pool) Standbys() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.standby))
	for d, l := range p.standby {
		out[d] = len(l)
	}
	return out
}

// HasStandby reports whether device has a standby tunnel here.
func (p *Pool) HasStandby(device string) bool { return p.StandbysOf(device) > 0 }

// StandbysOf counts device's standby tunnels here. A promotion asks it of
// one device, not Standbys of all: a drain promotes thousands, and
// copying thousands each time under the pool's lock held every tunnel
// of the relay up.
func (p *Pool) StandbysOf(device string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.standby[device])
}

// Promote turns device's standby tunnels into its tunnels here, which take
// requests at once, and returns how many it promoted and tell, which
// tells each of their agents on a stream of its own, naming next (a relay
// id, or "") as its next standby. A relay promoting thousands tells them
// while it promotes the next ones.
func (p *Pool) Promote(device string) (int, func(next string)) {
	p.mu.Lock()
	list := p.standby[device]
	delete(p.standby, device)
	p.mu.Unlock()
	var joined []*Session
	for _, s := range list {
		if _, err := p.join(s); err != nil {
			continue
		}
		joined = append(joined, s)
		p.promoted.Add(1)
	}
	return len(joined), func(next string) {
		for _, s := range joined {
			p.signalPromoted(s, next)
		}
	}
}

// CloseStandbys closes every standby tunnel: the relay is leaving, and
// their agents keep their standbys elsewhere.
func (p *Pool) CloseStandbys() int {
	p.mu.Lock()
	var all []*Session
	for _, l := range p.standby {
		all = append(all, l...)
	}
	p.mu.Unlock()
	for _, s := range all {
		s.Close()
	}
	return len(all)
}

// SuggestStandby names relay r to the agents of device's version 2
// tunnels here that know hot standby (they announced their ping interval)
// as the relay to keep a standby at; it returns how many it told. Agents
// from before hot standby are not asked: they would take the stream for
// a service.
func (p *Pool) SuggestStandby(device string, r RelayAddr) int {
	item := FormatRelays([]RelayAddr{r})
	if !validHeaderToken(r.ID) || item == "" {
		return 0
	}
	meta := SuggestMeta + " " + item
	p.mu.Lock()
	var list []*Session
	for _, s := range p.devices[device] {
		if s.paced && !s.draining.Load() {
			list = append(list, s)
		}
	}
	p.mu.Unlock()
	n := 0
	for _, s := range list {
		if p.signal(s, meta) {
			n++
		}
	}
	return n
}

// signalPromoted opens the promotion's stream on s.
func (p *Pool) signalPromoted(s *Session, next string) {
	meta := PromotedMeta
	if validHeaderToken(next) {
		meta += " " + next
	}
	p.signal(s, meta)
}

// signal opens a stream with meta on s, a version 2 session, and closes it
// once the agent has answered it (a reset), or after
// promotedSignalTimeout; it reports whether the stream went out.
func (p *Pool) signal(s *Session, meta string) bool {
	mc, ok := s.c.(*muxCarrier)
	if !ok {
		return false
	}
	st, err := mc.ms.Open(context.Background(), []byte(meta))
	if err != nil {
		return false
	}
	if err := st.CloseWrite(); err != nil { // sends the OPEN, with nothing after it
		st.Close()
		return false
	}
	p.watchers.Go(func() {
		st.SetReadDeadline(time.Now().Add(promotedSignalTimeout))
		io.Copy(io.Discard, st)
		st.Close()
	})
	return true
}

// HandOver stops sending device's tunnels here new requests, letting those
// in flight finish: the device moved to the relay that promoted its
// standby, and each agent retires its tunnel here by itself once its
// streams have ended, so the tunnels' idle pooled connections are closed
// as they turn idle. A tunnel still open after grace is drained as on a
// move (GOAWAY, then closed). It returns how many it handed over.
func (p *Pool) HandOver(device string, grace time.Duration) int {
	until := time.Now().Add(grace)
	return p.eachLive(device, func(s *Session) {
		s.draining.Store(true)
		s.goes() // streams spliced onto it from other relays are retired, as on a drain
		handOverTick(s, until)
	})
}

// handOverEvery is how often a handed-over tunnel's idle connections are
// closed.
const handOverEvery = 50 * time.Millisecond

// handOverTick closes s's idle pooled connections, and again every
// handOverEvery, until s ends; past until it drains s.
func handOverTick(s *Session, until time.Time) {
	select {
	case <-s.done:
		return
	default:
	}
	if time.Now().After(until) {
		s.c.shutdown(context.Background()) // ends when the streams do, or the connection dies
		return
	}
	if mc, ok := s.c.(*muxCarrier); ok {
		mc.closeIdle()
	}
	time.AfterFunc(handOverEvery, func() { handOverTick(s, until) })
}

// registerStandbyMetrics registers the standby tunnels' metrics with reg.
func (p *Pool) registerStandbyMetrics(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "switchboard_tunnel_standby_sessions",
		Help: "Standby tunnels this relay keeps for devices held by other relays.",
	}, func() float64 {
		p.mu.Lock()
		defer p.mu.Unlock()
		n := 0
		for _, l := range p.standby {
			n += len(l)
		}
		return float64(n)
	}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "switchboard_tunnel_standby_promotions_total",
			Help: "Standby tunnels this relay promoted to tunnels: its watchdog vetoed the device's holder, or the holder drained.",
		}, func() float64 { return float64(p.promoted.Load()) }))
}
