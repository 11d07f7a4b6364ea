package agent

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// maxRedirects bounds the redirects an agent follows in a row.
const maxRedirects = 2

// walker chooses the relay a native agent dials next. It starts with the
// configured entry points; a relay that takes the agent says which relay it
// is and lists the fleet's relays best first for the device, and a relay
// that should not hold the device redirects the agent to the one that
// should. When the agent loses its relay it walks that list, the lost relay
// last: naming it as unreachable when it fell silent.
type walker struct {
	entries []*url.URL
	entry   int

	learned []tunnel.RelayAddr // the last list a relay gave
	current tunnel.RelayAddr   // the relay of the current or last tunnel
	curURL  *url.URL

	queue       []candidate // to try next, in order
	redirect    *candidate  // a redirect to follow next
	redirects   int         // redirects followed in a row
	unreachable string      // the relay id to report as lost
	lostAt      time.Time   // when the last tunnel ended; zero while connected
}

// candidate is a relay to dial.
type candidate struct {
	url *url.URL
	id  string // "" for a configured entry point
}

func newWalker(entries []*url.URL) *walker { return &walker{entries: entries} }

// target returns the relay to dial next and the headers to send with it.
func (w *walker) target() (candidate, http.Header) {
	h := http.Header{}
	if !w.lostAt.IsZero() {
		h.Set(tunnel.LostHeader, strconv.FormatInt(time.Since(w.lostAt).Milliseconds(), 10))
	}
	if w.redirect != nil {
		h.Set(tunnel.RedirectedHeader, "1")
		return *w.redirect, h
	}
	if w.unreachable != "" {
		h.Set(tunnel.UnreachableHeader, w.unreachable)
	}
	if len(w.queue) > 0 {
		return w.queue[0], h
	}
	return candidate{url: w.entries[w.entry]}, h
}

// failed records that dialling c failed: it moves to the next candidate,
// and a relay the agent knows by id is reported unreachable from now on.
// It reports whether another relay of the list is left to try at once;
// false means a round is over and the agent should back off.
func (w *walker) failed(c candidate) (more bool) {
	defer func() { more = len(w.queue) > 0 }()
	switch {
	case w.redirect != nil:
		w.redirect = nil
		w.queue = w.others(c.id)
	case len(w.queue) > 0:
		w.queue = w.queue[1:]
	default:
		w.entry = (w.entry + 1) % len(w.entries)
	}
	if c.id != "" {
		w.unreachable = c.id
	}
	return
}

// redirected records a redirect; it reports false when too many came in a
// row, and the caller should back off.
func (w *walker) redirected(re *tunnel.RedirectError) bool {
	if len(re.Relays) > 0 {
		w.learned = re.Relays
	}
	w.redirects++
	if w.redirects > maxRedirects {
		w.redirect, w.redirects = nil, 0
		return false
	}
	w.redirect = &candidate{url: re.Location, id: re.Holder}
	return true
}

// connected records the relay that took the tunnel.
func (w *walker) connected(c candidate, p tunnel.Placed) {
	w.current = tunnel.RelayAddr{ID: p.RelayID, URL: c.url.String()}
	w.curURL = c.url
	if len(p.Relays) > 0 {
		w.learned = p.Relays
	}
	w.queue, w.redirect, w.redirects, w.unreachable = nil, nil, 0, ""
	w.lostAt = time.Time{}
}

// lost records the end of the tunnel. silent says the relay stopped
// answering (rather than closing the connection) and lastSign when it was
// last heard from: the device's move is timed from then.
func (w *walker) lost(silent bool, lastSign time.Time) {
	w.lostAt = time.Now()
	if silent {
		w.lostAt = lastSign
	}
	if silent {
		w.unreachable = w.current.ID
		w.queue = w.others(w.current.ID)
		return
	}
	// The relay closed the tunnel: a drain, a shutdown, a crash or a
	// cancel. The next relay of the list is the device's next home when
	// this one is going away; a relay that stays sends the agent back.
	w.queue = append(w.others(w.current.ID), candidate{url: w.curURL, id: w.current.ID})
}

// others is the learned list without the relay id.
func (w *walker) others(id string) []candidate {
	var out []candidate
	for _, r := range w.learned {
		if r.ID == id {
			continue
		}
		if u, err := url.Parse(r.URL); err == nil {
			out = append(out, candidate{url: u, id: r.ID})
		}
	}
	return out
}

// watchedConn tells whether a tunnel ended because the relay closed it (a
// read failed first) or because this side gave up on a silent relay (it
// closed the connection first: a ping went unanswered).
type watchedConn struct {
	net.Conn
	readFailed atomic.Bool
	closed     atomic.Bool
	lastRead   atomic.Int64 // unix nanoseconds of the last read that returned data
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.SawRead(n, err)
	return n, err
}

// A session over a watchedConn reads the socket beneath it itself and
// tells it what each read returned (see mux.Transparent).
var _ mux.Transparent = (*watchedConn)(nil)

func (c *watchedConn) Wrapped() net.Conn { return c.Conn }

func (c *watchedConn) SawRead(n int, err error) {
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
	}
	if err != nil && !c.closed.Load() {
		c.readFailed.Store(true)
	}
}

// lastSign returns when the relay was last heard from, or since when the
// connection is up if never.
func (c *watchedConn) lastSign(since time.Time) time.Time {
	if ns := c.lastRead.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return since
}

func (c *watchedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// silent reports whether the relay stopped answering: this side closed the
// connection before the relay did, and nothing came from the relay for
// quiet (the liveness timeout) before that. A close of this side that
// follows a failed write to a relay that was just heard from is the relay
// going away, not falling silent: the read that would have seen it lost
// the race.
func (c *watchedConn) silent(since time.Time, quiet time.Duration) bool {
	return !c.readFailed.Load() && time.Since(c.lastSign(since)) >= quiet
}
