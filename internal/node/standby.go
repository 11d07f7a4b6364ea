package node

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/httperr"
	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// Hot standby (docs/design/hot-standby.md): this relay keeps standby
// tunnels for devices held elsewhere, promotes them when its watchdog
// vetoes the holder or the holder asks (a drain), and, as a holder, names
// each agent's standby and asks it to promote when this relay drains.

// errStandbyLeaving refuses a standby on a relay that drains or stops.
var errStandbyLeaving = httperr.New(http.StatusServiceUnavailable, "this relay is draining; keep a standby at another")

// errStandbyHolder refuses a standby on the relay that holds the device.
var errStandbyHolder = httperr.New(http.StatusConflict, "this relay holds the device: connect a tunnel, not a standby")

// standbyHook is the tunnel endpoint's Standby: nil, refusing every
// standby as a relay from before hot standby, unless HotStandby, or when
// TunnelV1Only says so.
func (n *Node) standbyHook() func(*http.Request, string) error {
	if !n.cfg.HotStandby || n.cfg.TunnelV1Only {
		return nil
	}
	return n.acceptStandby
}

// acceptStandby decides whether this relay keeps a standby tunnel for
// device: not while it drains or stops, and not when it is the device's
// holder.
func (n *Node) acceptStandby(_ *http.Request, device string) error {
	if n.member == nil {
		return errStandbyLeaving
	}
	if n.draining() || n.stopping.Load() {
		return errStandbyLeaving
	}
	if e, ok := n.member.Entry(device); ok && e.RelayID == n.relayID && e.Agents > 0 {
		return errStandbyHolder
	}
	return nil
}

// nameStandby names, in the answer to an agent taken here, the relay it
// should keep its standby tunnel at.
func (n *Node) nameStandby(p *tunnel.Placement, device string) {
	if !n.cfg.HotStandby || n.cfg.TunnelV1Only {
		return
	}
	if t, ok := n.member.Standby(device, n.cfg.Region, n.placeVetoed); ok && !t.Self {
		p.Standby = t.ID
	}
}

// promoteFrom promotes every standby kept here whose device the directory
// records on relay id, which this relay's watchdog has just vetoed, after
// missing it for after (0 for a veto from the data path): the devices'
// moves are timed from the first miss.
func (n *Node) promoteFrom(id string, after time.Duration) {
	if n.member == nil {
		return
	}
	for device := range n.tunnels.Standbys() {
		if e, ok := n.member.Entry(device); ok && e.RelayID == id {
			n.promotions.add(promotion{device: device, from: id, why: "its holder is vetoed", lostFor: after})
		}
	}
}

// onPromote is relay from's request, as the device's holder, that this
// relay promote its standby of device: from drains.
func (n *Node) onPromote(device, from string) {
	if e, ok := n.member.Entry(device); !ok || e.RelayID != from {
		return // the device moved meanwhile: the request is stale
	}
	n.promotions.add(promotion{device: device, from: from, why: "its holder asked"})
}

// onRecordedHere promotes the standby tunnels of device, which the
// directory records here though this relay holds no tunnel of it: a
// promotion's write that timed out (a NATS cluster without its quorum)
// and landed later. The fleet routes the device here now, and the old
// holder hands it over.
func (n *Node) onRecordedHere(device string) {
	if n.tunnels.Has(device) {
		return
	}
	n.promotions.add(promotion{device: device, why: "the directory records it here"})
}

// promotion is a device whose standby tunnels here are to be promoted,
// from the relay that held it, why, and how long ago the device was lost.
type promotion struct {
	device, from, why string
	lostFor           time.Duration
}

// promote records in the directory the moves of the devices of batch
// whose standby tunnels are here, unless this relay is leaving, promotes
// the tunnels of each as its write lands (before this relay routes the
// device to them), and returns the step that tells their agents: the
// promoter runs it while the next batch's writes are in flight. A device
// whose write fails (NATS away) is not promoted, so that an agent never
// follows a move the fleet does not know of. Each move is timed from its
// lostFor ago.
func (n *Node) promote(batch []promotion) (tell func()) {
	if n.draining() || n.stopping.Load() {
		return nil
	}
	claims := make([]fleet.Claim, 0, len(batch))
	todo := make([]promotion, 0, len(batch))
	next := make([]string, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	for _, pr := range batch {
		k := n.tunnels.StandbysOf(pr.device)
		if k == 0 || seen[pr.device] {
			continue
		}
		seen[pr.device] = true
		vetoed := func(id string) bool { return id == pr.from || n.placeVetoed(id) }
		t, ok := n.member.Standby(pr.device, n.cfg.Region, vetoed)
		if !ok || t.Self {
			t.ID = ""
		}
		n.member.NoteLost(pr.device, pr.lostFor)
		claims = append(claims, fleet.Claim{Device: pr.device, Agents: k})
		todo = append(todo, pr)
		next = append(next, t.ID)
	}
	if len(claims) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), promoteTimeout)
	defer cancel()
	tells := make([]func(next string), len(claims))
	promoted := make([]int, len(claims))
	errs := n.member.ClaimPromoted(ctx, claims, func(i int) {
		promoted[i], tells[i] = n.tunnels.Promote(todo[i].device) // each join tells the fleet of the change
	})
	return func() {
		for i, pr := range todo {
			switch {
			case errs[i] != nil:
				n.log.Warn("standby not promoted: the directory could not record the move", logkey.Device, pr.device, logkey.Holder, pr.from, logkey.Err, errs[i])
			case promoted[i] > 0:
				tells[i](next[i])
				n.log.Info("standby promoted", logkey.Device, pr.device, logkey.Holder, pr.from, logkey.Reason, pr.why, logkey.Tunnels, promoted[i])
			}
		}
	}
}

// promoteTimeout bounds a batch of promotions' directory writes.
const promoteTimeout = 2 * time.Second

// promoter runs promotions in batches, in goroutines that close waits for:
// what is asked while batches' directory writes are in flight goes out
// with everything else asked meanwhile, as the next batch, its writes
// pipelined together (fleet.Member.ClaimPromoted). A
// veto of a holder promotes all its devices kept here at once, and a
// drain asks for thousands, one message each. A batch's agents are told
// of their promotion (a stream opened on each) while the next batch's
// writes are in flight, batch after batch in the order they were taken.
type promoter struct {
	run func(batch []promotion) (then func()) // set before the first add

	mu      sync.Mutex // guards the fields below, and wg's Go against close's Wait
	closed  bool
	queue   []promotion
	running bool // a goroutine is taking batches off queue
	wg      sync.WaitGroup
}

// promoteBatch bounds a batch of promotions: their writes are in flight
// at once, each on the store's connection, within promoteTimeout.
const promoteBatch = 1024

// add queues pr for the next batch, unless the promoter is closed.
func (p *promoter) add(pr promotion) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.queue = append(p.queue, pr)
	if !p.running {
		p.running = true
		p.wg.Go(p.loop)
	}
}

// promoteFlights bounds the batches whose writes are in flight at once:
// while one waits for NATS, the next is written.
const promoteFlights = 2

// loop runs the queued batches until none is left, up to promoteFlights
// of them at once, and each batch's then step after the one before it.
func (p *promoter) loop() {
	slots := make(chan struct{}, promoteFlights)
	var last chan struct{} // closed when the last batch's then step has run
	for {
		slots <- struct{}{}
		p.mu.Lock()
		k := min(len(p.queue), promoteBatch)
		if k == 0 || p.closed {
			<-slots
			if last != nil {
				p.mu.Unlock()
				<-last
				last = nil
				continue // look again: more may have been asked meanwhile
			}
			p.running, p.queue = false, nil
			p.mu.Unlock()
			return
		}
		batch := p.queue[:k:k]
		p.queue = p.queue[k:]
		p.mu.Unlock()
		prev, done := last, make(chan struct{})
		last = done
		go func() {
			defer close(done)
			then := p.run(batch)
			<-slots
			if prev != nil {
				<-prev
			}
			if then != nil {
				then()
			}
		}()
	}
}

// close runs nothing more and waits for what runs.
func (p *promoter) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
}

// flipToStandby asks the relay keeping device's standby to promote it,
// when that relay would take the device now; it reports whether it asked.
func (n *Node) flipToStandby(device string) bool {
	e, ok := n.member.Entry(device)
	if !ok || e.Standby == "" || e.RelayID != n.relayID {
		return false
	}
	t, ok := n.member.Holder(device, n.cfg.Region, n.placeVetoed, "")
	if !ok || t.ID != e.Standby {
		return false
	}
	n.member.AskPromote(device, e.Standby)
	n.flipsAsked.Store(device, time.Now())
	return true
}

// flipWait is how long a drain leaves an agent whose standby relay it
// asked to promote before it sends the agent on: the promotion is one
// directory write at that relay, and a drain asks for all its devices at
// once.
const flipWait = 2 * time.Second

// flipAll asks, as a drain begins, the standby relay of every device held
// here to promote its standby, all at once rather than spread over the
// drain: a promotion costs that relay a directory write, not a reconnect.
// The agents whose standby does not take them are sent on by the spread
// drain as before. It returns how many it asked.
func (n *Node) flipAll() int {
	if n.member == nil {
		return 0
	}
	k := 0
	for _, device := range n.tunnels.Devices() {
		if n.flipToStandby(device) {
			k++
		}
	}
	return k
}

// drainMovable is the check a drain makes at each agent's moment: move
// (nil for always) says whether the agent may be sent on. An agent whose
// standby relay was asked to promote less than flipWait ago stays: it
// retires its tunnel here once promoted, and is asked about again later
// (sent on then, if the standby relay did not promote). One whose standby
// relay was not asked yet (its standby came during the drain) is asked
// now, and stays likewise.
func (n *Node) drainMovable(move func(device string) bool) func(device string) bool {
	return func(device string) bool {
		if move != nil && !move(device) {
			return false
		}
		if v, asked := n.flipsAsked.Load(device); asked {
			if time.Since(v.(time.Time)) < flipWait {
				return false
			}
			n.flipsAsked.Delete(device)
			return true // asked, and still here: send it on
		}
		return !n.flipToStandby(device)
	}
}

// forgetFlips forgets the drain's promotion requests: the drain ended.
func (n *Node) forgetFlips() {
	n.flipsAsked.Range(func(k, _ any) bool {
		n.flipsAsked.Delete(k)
		return true
	})
}

// handOverGrace is how long a tunnel handed over to a promoted standby may
// stay before this relay drains it: its agent retires it at once, and
// only one that missed its promotion is still there.
const handOverGrace = 3 * time.Second

// handOver is told that relay to promoted its standby of device: this
// relay's tunnels of it take no new requests and are left for their
// agent to retire, its long-poll agents' polls end, and its topics move.
func (n *Node) handOver(device, to string) {
	n.flipsAsked.Delete(device)
	k := n.tunnels.HandOver(device, handOverGrace)
	n.broker.ForgetDevice(device)
	n.topics.Moved(device)
	if k > 0 { // the cancel message and the directory both tell of the move: log it once
		n.log.Info("device handed over to its standby", logkey.Device, device, logkey.Holder, to, logkey.Tunnels, k)
	}
	n.member.Changed()
}

// Standbys counts the standby tunnels this relay keeps, by device.
func (n *Node) Standbys() map[string]int { return n.tunnels.Standbys() }

// suggestEvery is how often a relay looks for devices it holds whose
// agents keep no standby: it names one to a device's agents when two
// rounds in a row found none recorded (an agent just connected is still
// dialling the standby its answer named), and waits suggestAgain before
// naming one to the same device's agents again.
const (
	suggestEvery = 2 * time.Second
	suggestAgain = time.Minute
)

// suggester is suggestLoop's memory of the devices held here without a
// standby.
type suggester struct {
	missing map[string]bool      // devices the last round found without a standby
	told    map[string]time.Time // device → when its agents were last named one
}

// suggestLoop names a standby relay, every suggestEvery, to the agents of
// devices held here that the directory has recorded with none for a round
// (a relay became available after they connected, or the standby they
// were named went), until ctx ends.
func (n *Node) suggestLoop(ctx context.Context) {
	sg := &suggester{missing: map[string]bool{}, told: map[string]time.Time{}}
	t := time.NewTicker(suggestEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.suggestStandbys(sg, time.Now())
	}
}

// suggestStandbys is one round of suggestLoop; it returns how many
// devices' agents it named a standby to.
func (n *Node) suggestStandbys(sg *suggester, now time.Time) int {
	if n.member == nil || !n.cfg.HotStandby || n.cfg.TunnelV1Only || n.draining() || n.stopping.Load() {
		clear(sg.missing)
		return 0
	}
	for d, at := range sg.told {
		if now.Sub(at) > suggestAgain {
			delete(sg.told, d)
		}
	}
	devices := n.tunnels.Devices()
	if len(devices) == 0 {
		clear(sg.missing)
		return 0
	}
	if _, ok := n.member.Standby(devices[0], n.cfg.Region, n.placeVetoed); !ok {
		// No other relay is available, for any device: nothing to name,
		// and no need to read the directory (a relay alone in its fleet).
		clear(sg.missing)
		return 0
	}
	missing := make(map[string]bool, len(sg.missing))
	var due []string
	for _, device := range devices {
		e, ok := n.member.Entry(device)
		if !ok || e.RelayID != n.relayID || e.Standby != "" {
			continue
		}
		missing[device] = true
		if _, recent := sg.told[device]; sg.missing[device] && !recent {
			due = append(due, device) // the second round in a row without one
		}
	}
	sg.missing = missing
	k := 0
	for _, device := range due {
		t, ok := n.member.Standby(device, n.cfg.Region, n.placeVetoed)
		if !ok {
			break // no other relay is available any more, for any device: the next round looks again
		}
		if !t.Self && n.tunnels.SuggestStandby(device, tunnel.RelayAddr{ID: t.ID, URL: t.Address}) > 0 {
			k++
		}
		sg.told[device] = now
	}
	return k
}
