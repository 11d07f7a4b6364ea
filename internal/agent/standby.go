package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/backoff"
	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// standbyRetry bounds the back-off between two tries of a standby.
var standbyRetry = backoff.Policy{First: time.Second, Base: time.Second, Max: 8 * time.Second}

// tunnelRun is one tunnel the agent serves, in a goroutine of its own:
// its tunnel, or its standby.
type tunnelRun struct {
	c        candidate
	placed   tunnel.Placed
	version  int
	wc       *watchedConn
	up       time.Time
	done     chan struct{}         // closed when serving returned
	promoted chan string           // receives the next standby's id when the relay promotes this tunnel
	suggest  chan tunnel.RelayAddr // receives a relay to keep a standby at, named by this tunnel's relay
	retire   chan struct{}         // closed to retire the tunnel
	away     chan struct{}         // closed when the relay sends GOAWAY: it drains
	once     sync.Once
	alone    atomic.Bool // no standby stands by it: pinged quickly (see watch)
}

// retireNow retires the tunnel: no new streams, closed when those in
// flight have ended.
func (t *tunnelRun) retireNow() { t.once.Do(func() { close(t.retire) }) }

// quickLiveness watches a tunnel that no standby stands by.
var quickLiveness = tunnel.Liveness{}.WithDefaults()

// quiet is how long t's relay must have been silent for its end to count
// as the relay falling silent.
func (t *tunnelRun) quiet(l tunnel.Liveness) time.Duration {
	if t.alone.Load() {
		return min(l.WithDefaults().Timeout, quickLiveness.Timeout)
	}
	return l.WithDefaults().Timeout
}

// serveTunnel serves conn in a goroutine that wg waits for; alone says
// whether it starts without a standby beside it (a standby itself has
// none and needs none).
func (a *Agent) serveTunnel(ctx context.Context, wg *sync.WaitGroup, c candidate, conn net.Conn, placed tunnel.Placed, version int, handler http.Handler, alone bool) *tunnelRun {
	t := &tunnelRun{
		c: c, placed: placed, version: version,
		wc: &watchedConn{Conn: conn}, up: time.Now(),
		done: make(chan struct{}), promoted: make(chan string, 1), suggest: make(chan tunnel.RelayAddr, 1), retire: make(chan struct{}),
		away: make(chan struct{}),
	}
	t.alone.Store(alone)
	wg.Go(func() {
		defer close(t.done)
		if version == tunnel.V2 {
			tunnel.ServeStreamsWith(ctx, t.wc, a.cfg.Liveness, t.dialer(a), tunnel.StreamOptions{
				Retire: t.retire, Fast: t.alone.Load, Quick: quickLiveness,
				Away: func() { close(t.away) },
			})
		} else {
			tunnel.Serve(ctx, t.wc, handler, a.cfg.Liveness)
		}
	})
	return t
}

// dialer is the agent's service dialler for t, which notes a promotion
// instead of dialling.
func (t *tunnelRun) dialer(a *Agent) tunnel.DialService {
	return func(ctx context.Context, name string) (net.Conn, error) {
		if next, ok := tunnel.Promoted(name); ok {
			select {
			case t.promoted <- next:
			default:
			}
			return nil, fmt.Errorf("%w: %w", tunnel.ErrPromotionNoted, service.ErrUnknown)
		}
		if r, ok := tunnel.Suggested(name); ok {
			select {
			case t.suggest <- r:
			default:
			}
			return nil, fmt.Errorf("standby suggestion noted: %w", service.ErrUnknown)
		}
		return a.dialStream(ctx, name)
	}
}

// standby is the standby tunnel beside an agent's tunnel, and the dial
// of the next one: owned by hold's loop.
type standby struct {
	want    string     // the id of the relay to keep it at; "" for none
	wantURL *url.URL   // want's address when the holder named it later, else nil
	run     *tunnelRun // the standby tunnel, or nil
	dialing bool       // a dial is under way; its result comes on dialed
	dialed  chan standbyDial
	retry   *time.Timer // set while a retry waits
	bo      *backoff.Backoff
}

// standbyDial is a standby dial's result.
type standbyDial struct {
	run *tunnelRun
	err error
}

// hold serves cur, with a standby tunnel beside it when its relay named
// one, until cur is lost and no standby took its place; it returns the
// tunnel last served. A promotion makes the standby the tunnel: the old
// one is retired (its streams finish), and a new standby is dialled. When
// the tunnel's relay sends GOAWAY (it drains, and its standby did not
// take the device) hold returns at once with away true: the agent
// connects elsewhere while the old tunnel's streams, TCP connections
// that may last hours, finish beside the next one.
func (a *Agent) hold(ctx context.Context, wg *sync.WaitGroup, w *walker, cur *tunnelRun) (last *tunnelRun, away bool) {
	sctx, cancel := context.WithCancel(ctx)
	sb := &standby{dialed: make(chan standbyDial, 1), bo: backoff.New(standbyRetry)}
	sb.want = a.standbyFor(cur, cur.placed.Standby)
	defer func() {
		// The standby is retired, not closed: its relay may have promoted
		// it as the tunnel beside it ended (a killed holder), and requests
		// sent on it then finish there.
		cancel()
		if sb.dialing {
			if r := <-sb.dialed; r.run != nil {
				r.run.retireNow()
			}
		}
		if sb.run != nil {
			sb.run.retireNow()
		}
		if sb.retry != nil {
			sb.retry.Stop()
		}
	}()
	for {
		// Without a live standby no relay would move the device: the
		// tunnel is watched with quick pings until one stands by again.
		cur.alone.Store(sb.run == nil)
		if sb.want != "" && sb.run == nil && !sb.dialing && sb.retry == nil {
			u := w.addressOf(sb.want)
			if u == nil && sb.wantURL != nil {
				u = sb.wantURL // a relay its holder named later, in no list the agent has
			}
			if u == nil {
				sb.want = "" // in no relay list the agent has: its holder may name one later
			} else {
				sb.dialing = true
				holder, id := cur.placed.RelayID, sb.want
				wg.Go(func() { sb.dialed <- a.dialStandby(sctx, ctx, wg, u, holder, id) })
			}
		}
		var promoted <-chan string
		var sbDone <-chan struct{}
		if sb.run != nil {
			promoted, sbDone = sb.run.promoted, sb.run.done
		}
		var retry <-chan time.Time
		if sb.retry != nil {
			retry = sb.retry.C
		}
		select {
		case <-ctx.Done():
			return cur, false
		case <-cur.away:
			if next, ok := promotedAlready(sb.run); ok {
				cur = a.adopt(w, cur, sb, next)
				continue
			}
			return cur, true
		case <-cur.done:
			next, ok := promotedAlready(sb.run)
			if !ok {
				next, ok = awaitPromotion(ctx, sb.run, a.cfg.PromotionWait)
			}
			if !ok {
				return cur, false
			}
			cur = a.adopt(w, cur, sb, next)
		case next := <-promoted:
			cur = a.adopt(w, cur, sb, next)
		case r := <-cur.suggest:
			// The holder names a standby when the directory records none:
			// one standing by, or being dialled, is on its way there, but
			// one refused or failing gives way to the holder's choice.
			// The holder names it to all of its devices' agents in one
			// round (a relay joined): each waits a random part of
			// StandbySpread before dialling.
			if sb.run == nil && !sb.dialing {
				sb.want = a.standbyFor(cur, r.ID)
				sb.wantURL, _ = url.Parse(r.URL)
				if sb.retry != nil {
					sb.retry.Stop()
				}
				sb.retry = time.NewTimer(rand.N(a.cfg.StandbySpread))
			}
		case <-sbDone:
			sb.run = nil
			sb.retry = time.NewTimer(sb.bo.Next(time.Now()))
		case r := <-sb.dialed:
			sb.dialing = false
			switch {
			case r.err == nil:
				sb.run = r.run
				sb.bo.Up(time.Now())
			case errors.Is(r.err, tunnel.ErrNotSupported), errors.Is(r.err, tunnel.ErrRefused):
				a.cfg.Logger.Debug("no standby tunnel", logkey.Device, a.cfg.Device, logkey.RelayID, sb.want, logkey.Err, r.err)
				sb.want, sb.wantURL = "", nil
			default:
				a.cfg.Logger.Debug("standby tunnel failed", logkey.Device, a.cfg.Device, logkey.RelayID, sb.want, logkey.Err, r.err)
				sb.retry = time.NewTimer(sb.bo.Next(time.Now()))
			}
		case <-retry:
			sb.retry = nil
		}
	}
}

// promotedAlready returns the next standby's id when run, the standby,
// was promoted before the tunnel beside it ended: the relay that promoted
// it hands the old tunnel over rather than closing it, so a tunnel that
// closes with its standby unpromoted is lost, and the agent walks on.
func promotedAlready(run *tunnelRun) (string, bool) {
	if run == nil {
		return "", false
	}
	select {
	case next := <-run.promoted:
		return next, true
	default:
		return "", false
	}
}

// awaitPromotion waits up to wait (Config.PromotionWait) for run, the
// standby, to be promoted; it returns the next standby's id when it was.
func awaitPromotion(ctx context.Context, run *tunnelRun, wait time.Duration) (string, bool) {
	if run == nil {
		return "", false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case next := <-run.promoted:
		return next, true
	case <-run.done:
	case <-t.C:
	case <-ctx.Done():
	}
	return "", false
}

// adopt makes sb's standby the agent's tunnel, retires the old one, and
// asks for a standby at next.
func (a *Agent) adopt(w *walker, old *tunnelRun, sb *standby, next string) *tunnelRun {
	cur := sb.run
	sb.run = nil
	old.retireNow()
	w.connected(cur.c, cur.placed)
	a.cfg.Logger.Info("agent moved to its standby tunnel", logkey.Device, a.cfg.Device, logkey.RelayID, cur.placed.RelayID, logkey.Holder, old.placed.RelayID)
	a.setState("connected", logkey.Relay, cur.c.url.Redacted(), logkey.RelayID, cur.placed.RelayID, logkey.Protocol, ProtocolNative, logkey.TunnelVersion, cur.version)
	sb.want, sb.wantURL = a.standbyFor(cur, next), nil
	if sb.retry != nil {
		sb.retry.Stop()
		sb.retry = nil
	}
	sb.bo.Up(time.Now())
	return cur
}

// standbyFor returns the relay id to keep a standby at beside cur, "" for
// none: only version 2 tunnels over an HTTP/1.1 Upgrade keep one.
func (a *Agent) standbyFor(cur *tunnelRun, id string) string {
	if a.cfg.NoStandby || a.cfg.WebSocket || cur.version != tunnel.V2 || id == cur.placed.RelayID {
		return ""
	}
	return id
}

// dialStandby opens a standby tunnel to relay id at u for the device held
// by relay holder, within dialCtx, and serves it until ctx ends in a
// goroutine that wg waits for.
func (a *Agent) dialStandby(dialCtx, ctx context.Context, wg *sync.WaitGroup, u *url.URL, holder, id string) standbyDial {
	dctx, cancel := context.WithTimeout(dialCtx, 15*time.Second)
	defer cancel()
	header := http.Header{wire.InstanceHeader: {a.instance}, tunnel.HolderHeader: {holder}, tunnel.PingHeader: {a.pingMs()}}
	conn, err := tunnel.Dial(dctx, tunnel.DialConfig{
		Relay: u, Device: a.cfg.Device, Token: a.cfg.Token,
		Instance: a.instance, TLS: a.cfg.tlsConfig(),
		Version: tunnel.V2, Services: a.announce, Standby: true,
	}, header)
	if err != nil {
		return standbyDial{err: err}
	}
	placed := tunnel.PlacedOf(conn)
	if placed.RelayID == "" {
		placed.RelayID = id
	}
	return standbyDial{run: a.serveTunnel(ctx, wg, candidate{url: u, id: id}, conn, placed, tunnel.V2, nil, false)}
}

// addressOf returns the URL of relay id from the last relay list.
func (w *walker) addressOf(id string) *url.URL {
	for _, r := range w.learned {
		if r.ID == id {
			if u, err := url.Parse(r.URL); err == nil {
				return u
			}
		}
	}
	return nil
}

// pingMs is the agent's ping interval in milliseconds, as PingHeader
// announces it.
func (a *Agent) pingMs() string {
	return strconv.FormatInt(a.cfg.Liveness.Interval.Milliseconds(), 10)
}
