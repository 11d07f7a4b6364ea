// Package topic owns a relay's broadcast topics: named streams of whole
// messages that a device's programs write once and many users read. A
// topic lives in a Hub while it has readers or writers; every reader has a
// bounded queue of its own, so that a reader that falls behind loses whole
// messages (counted) or is cut, and never slows the writer or the other
// readers.
//
// One copy per relay: the relay holding the topic's device keeps the topic
// itself; every other relay with readers takes one copy of it from the
// holder (through a Link) and fans it out locally. The call sequence of a
// relay:
//
//	hub := topic.NewHub(cfg)          // cfg.Link reaches the holder
//	r, err := hub.Join(key, false)    // a user reads; the hub feeds the
//	defer r.Leave()                   // topic from the holder when needed
//	batch, err := r.Next(ctx, nil)    // whole messages, in order
//
//	w, err := hub.Write(key)          // a writer here (at the holder)
//	w.Publish(topic.Message{…})
//	w.Leave()
//
// Handler serves all of it as websockets at /topic/<device>/<name>.
package topic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/backoff"
)

// Defaults of Config.
const (
	DefaultQueueMessages   = 128
	DefaultQueueBytes      = 8 << 20
	DefaultMaxLag          = 5 * time.Second
	DefaultMaxMessageBytes = 1 << 20
	// MaxBacklog bounds Config.Backlog.
	MaxBacklog = 1024
)

// Config sets a hub's limits. Zero fields take the defaults named on them.
type Config struct {
	// QueueMessages is how many messages a reader's queue holds before the
	// oldest are dropped. Default 128.
	QueueMessages int
	// QueueBytes is how many bytes of messages a reader's queue holds
	// before the oldest are dropped; a queue always takes one message,
	// however large. Default 8 MiB.
	QueueBytes int
	// MaxLag cuts a reader whose oldest undelivered message waited this
	// long, or whose connection took this long to take one message.
	// Default 5 s; negative: never.
	MaxLag time.Duration
	// MaxMessageBytes is the largest message a writer may send; a larger
	// one ends the writer's connection (websocket status 1009). Default 1 MiB.
	MaxMessageBytes int
	// Backlog is how many of a topic's last messages a new reader gets
	// before the next one. Default 0: readers join at the next message.
	// At most MaxBacklog.
	Backlog int
	// Link reaches the relay holding a topic's device; nil: every topic
	// is held here (a relay alone).
	Link Link
	// Retry spaces the attempts to feed a topic from its holder.
	Retry backoff.Policy
	// Logger receives the hub's logs; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Complete fills in the defaults.
func (c *Config) Complete() {
	if c.QueueMessages <= 0 {
		c.QueueMessages = DefaultQueueMessages
	}
	if c.QueueBytes <= 0 {
		c.QueueBytes = DefaultQueueBytes
	}
	if c.MaxLag == 0 {
		c.MaxLag = DefaultMaxLag
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
}

// wire fills in the parts that are not settings: the logger and the clock.
func (c *Config) wire() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate rejects limits that cannot work.
func (c *Config) Validate() error {
	if c.Backlog < 0 || c.Backlog > MaxBacklog {
		return fmt.Errorf("a topic's backlog is 0 to %d messages; %d was asked", MaxBacklog, c.Backlog)
	}
	if c.Backlog > c.QueueMessages {
		return fmt.Errorf("a topic's backlog (%d messages) must fit a reader's queue (%d messages)", c.Backlog, c.QueueMessages)
	}
	return nil
}

// Errors that end a reader or a writer.
var (
	// ErrLagging cuts a reader that fell behind by more than MaxLag.
	ErrLagging = errors.New("the reader fell too far behind")
	// ErrClosed ends everything when the hub closes (the relay stops).
	ErrClosed = errors.New("the relay is stopping")
	// ErrCancelled ends a device's readers and writers when an operator
	// cancels its sessions.
	ErrCancelled = errors.New("the device's sessions were cancelled")
	// ErrMoved ends a relay's copy of a topic when the device moved to
	// another relay, so that its readers are fed from the new holder.
	ErrMoved = errors.New("the device moved to another relay")
	// ErrLocal is what a Link answers when this relay holds the device.
	ErrLocal = errors.New("this relay holds the device")
)

// Key names a topic: a device and a name it publishes under.
type Key struct {
	Device string
	Name   string
}

func (k Key) String() string { return k.Device + "/" + k.Name }

// Message is one whole message of a topic. Its Data is shared by every
// reader and never changed once published.
type Message struct {
	Binary bool // a binary websocket message; false: text
	Data   []byte
	at     time.Time // when this relay took it
}

// Hub holds the topics of one relay. It is safe for concurrent use.
type Hub struct {
	cfg Config
	wg  sync.WaitGroup // the feeds

	mu     sync.Mutex // guards the fields below
	topics map[Key]*Topic
	closed bool

	totals totals // of topics gone, so that the metrics' counters never go back
}

// NewHub returns a hub with the limits of cfg (completed).
func NewHub(cfg Config) (*Hub, error) {
	cfg.Complete()
	cfg.wire()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Hub{cfg: cfg, topics: map[Key]*Topic{}}, nil
}

// Config returns the hub's completed configuration.
func (h *Hub) Config() Config { return h.cfg }

// Topic is one topic on this relay, while it has readers or writers.
type Topic struct {
	hub *Hub
	key Key
	counters

	mu       sync.Mutex // guards the fields below
	readers  map[*Reader]struct{}
	users    int // readers that are users, not other relays
	writers  map[*Writer]struct{}
	gone     bool      // forgotten by the hub: a newcomer makes a new topic
	backlog  []Message // the last Backlog messages, oldest first
	feeding  bool      // a feed from the holder runs or is wanted
	stopFeed context.CancelFunc
	fed      bool // the feed is connected to the holder
}

// counters are a topic's totals since it appeared on this relay.
type counters struct {
	published      atomic.Int64 // messages taken from writers or the holder
	publishedBytes atomic.Int64
	toUsers        atomic.Int64 // messages delivered to users' connections
	toUsersBytes   atomic.Int64
	toRelays       atomic.Int64 // messages delivered to other relays
	toRelaysBytes  atomic.Int64
	dropped        atomic.Int64 // messages readers lost, whole
	cut            atomic.Int64 // readers cut for lagging
}

// totals are the counters of topics gone from the hub.
type totals struct {
	published, publishedBytes, toUsers, toUsersBytes, toRelays, toRelaysBytes, dropped, cut int64
}

func (t *totals) add(c *counters) {
	t.published += c.published.Load()
	t.publishedBytes += c.publishedBytes.Load()
	t.toUsers += c.toUsers.Load()
	t.toUsersBytes += c.toUsersBytes.Load()
	t.toRelays += c.toRelays.Load()
	t.toRelaysBytes += c.toRelaysBytes.Load()
	t.dropped += c.dropped.Load()
	t.cut += c.cut.Load()
}

// acquire returns the topic key, made if it is new.
func (h *Hub) acquire(key Key) (*Topic, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	t := h.topics[key]
	if t == nil {
		t = &Topic{hub: h, key: key, readers: map[*Reader]struct{}{}, writers: map[*Writer]struct{}{}}
		h.topics[key] = t
	}
	return t, nil
}

// releaseLocked forgets t once nothing uses it. t.mu is held.
func (t *Topic) releaseLocked() {
	if len(t.readers) > 0 || len(t.writers) > 0 {
		return
	}
	t.gone = true
	h := t.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.topics[t.key] == t {
		delete(h.topics, t.key)
		h.totals.add(&t.counters)
	}
}

// Join adds a reader to the topic key: a user's connection, or another
// relay's feed (peer). A user's reader on a relay that does not hold the
// device starts the topic's feed from the holder. The reader gets the
// topic's backlog, then every message published after it joined.
func (h *Hub) Join(key Key, peer bool) (*Reader, error) {
	for {
		t, err := h.acquire(key)
		if err != nil {
			return nil, err
		}
		t.mu.Lock()
		if t.gone { // forgotten between acquire and now
			t.mu.Unlock()
			continue
		}
		r := &Reader{t: t, peer: peer, ready: make(chan struct{}, 1)}
		now := h.cfg.Now()
		for _, m := range t.backlog {
			m.at = now // its wait here starts now
			r.queue = append(r.queue, m)
			r.bytes += len(m.Data)
		}
		if len(r.queue) > 0 {
			r.ready <- struct{}{}
		}
		t.readers[r] = struct{}{}
		if !peer {
			t.users++
			t.startFeedLocked()
		}
		t.mu.Unlock()
		return r, nil
	}
}

// Write adds a writer to the topic key on this relay.
func (h *Hub) Write(key Key) (*Writer, error) {
	for {
		t, err := h.acquire(key)
		if err != nil {
			return nil, err
		}
		t.mu.Lock()
		if t.gone {
			t.mu.Unlock()
			continue
		}
		w := &Writer{t: t, done: make(chan struct{})}
		t.writers[w] = struct{}{}
		t.mu.Unlock()
		return w, nil
	}
}

// Writer publishes to a topic on this relay.
type Writer struct {
	t    *Topic
	done chan struct{} // closed when the writer is ended (err says why)
	err  error         // set before done is closed
}

// Done is closed when the hub ends the writer (Err says why): the
// device's sessions were cancelled or the relay stops.
func (w *Writer) Done() <-chan struct{} { return w.done }

// Err is why the writer was ended; read it once Done is closed.
func (w *Writer) Err() error { return w.err }

// Publish hands m to every reader of the topic. It never waits for a
// reader: a full queue loses its oldest messages instead.
func (w *Writer) Publish(m Message) { w.t.publish(m) }

// End ends the topic's stream: its readers get what they have queued,
// then err from Next. The writer leaves.
func (w *Writer) End(err error) {
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	for r := range t.readers {
		r.mu.Lock()
		if r.end == nil {
			r.end = err
		}
		r.signal()
		r.mu.Unlock()
		t.removeLocked(r)
	}
	if _, ok := t.writers[w]; ok {
		delete(t.writers, w)
		t.releaseLocked()
	}
}

// Leave ends the writer.
func (w *Writer) Leave() {
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.writers[w]; ok {
		delete(t.writers, w)
		t.releaseLocked()
	}
}

// publish hands m to every reader.
func (t *Topic) publish(m Message) {
	cfg := &t.hub.cfg
	m.at = cfg.Now()
	t.published.Add(1)
	t.publishedBytes.Add(int64(len(m.Data)))
	t.mu.Lock()
	defer t.mu.Unlock()
	if cfg.Backlog > 0 {
		if len(t.backlog) == cfg.Backlog {
			copy(t.backlog, t.backlog[1:])
			t.backlog = t.backlog[:len(t.backlog)-1]
		}
		t.backlog = append(t.backlog, m)
	}
	for r := range t.readers {
		if !r.offer(m, cfg) {
			t.cut.Add(1)
			t.removeLocked(r)
		}
	}
}

// removeLocked takes r off the topic. t.mu is held.
func (t *Topic) removeLocked(r *Reader) {
	if _, ok := t.readers[r]; !ok {
		return
	}
	delete(t.readers, r)
	if !r.peer {
		if t.users--; t.users == 0 && t.stopFeed != nil {
			t.stopFeed()
			t.stopFeed = nil
		}
	}
	t.releaseLocked()
}

// cutLocked ends t's readers that are other relays' feeds with err, and
// unless peersOnly its users' readers and its writers too. t.mu is held.
func (t *Topic) cutLocked(err error, peersOnly bool) int {
	n := 0
	for r := range t.readers {
		if peersOnly && !r.peer {
			continue
		}
		r.cut(err)
		t.removeLocked(r)
		n++
	}
	if peersOnly {
		return n
	}
	n += t.endWritersLocked(err)
	t.releaseLocked()
	return n
}

// endWritersLocked ends t's writers with err and returns how many. t.mu
// is held.
func (t *Topic) endWritersLocked(err error) int {
	n := len(t.writers)
	for w := range t.writers {
		w.err = err
		close(w.done)
		delete(t.writers, w)
	}
	return n
}

// Reader is one reader of a topic, with its bounded queue.
type Reader struct {
	t     *Topic
	peer  bool
	ready chan struct{} // holds a token while the queue has news

	mu      sync.Mutex // guards the fields below
	queue   []Message
	bytes   int
	err     error // why the reader was cut; nil while it reads
	end     error // returned once the queue is empty: the stream ended
	dropped int64
}

// Peer reports whether the reader is another relay's feed.
func (r *Reader) Peer() bool { return r.peer }

// Topic returns the reader's topic.
func (r *Reader) Topic() *Topic { return r.t }

// offer queues m, dropping the oldest messages to make room. It returns
// false when the reader is cut: its oldest message waited past MaxLag.
func (r *Reader) offer(m Message, cfg *Config) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return true // already cut; removed by whoever cut it
	}
	if cfg.MaxLag > 0 && len(r.queue) > 0 && m.at.Sub(r.queue[0].at) > cfg.MaxLag {
		r.cutLocked(fmt.Errorf("%w: a message waited %s (at most %s)", ErrLagging, m.at.Sub(r.queue[0].at).Round(time.Millisecond), cfg.MaxLag))
		return false
	}
	for len(r.queue) > 0 && (len(r.queue) >= cfg.QueueMessages || r.bytes+len(m.Data) > cfg.QueueBytes) {
		r.bytes -= len(r.queue[0].Data)
		r.queue[0] = Message{}
		r.queue = r.queue[1:]
		r.dropped++
		r.t.dropped.Add(1)
	}
	r.queue = append(r.queue, m)
	r.bytes += len(m.Data)
	r.signal()
	return true
}

func (r *Reader) signal() {
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

// cut ends the reader with err.
func (r *Reader) cut(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cutLocked(err)
}

func (r *Reader) cutLocked(err error) {
	if r.err == nil {
		r.err = err
		r.queue, r.bytes = nil, 0
		r.signal()
	}
}

// Next waits for queued messages and returns them, oldest first,
// appended to buf[:0]; or the error that cut the reader, or ctx's.
func (r *Reader) Next(ctx context.Context, buf []Message) ([]Message, error) {
	for {
		r.mu.Lock()
		if r.err != nil {
			err := r.err
			r.mu.Unlock()
			return buf[:0], err
		}
		if len(r.queue) > 0 {
			buf = append(buf[:0], r.queue...)
			clear(r.queue)
			r.queue, r.bytes = r.queue[:0], 0
			r.mu.Unlock()
			return buf, nil
		}
		if r.end != nil {
			err := r.end
			r.mu.Unlock()
			return buf[:0], err
		}
		r.mu.Unlock()
		select {
		case <-r.ready:
		case <-ctx.Done():
			return buf[:0], ctx.Err()
		}
	}
}

// Delivered counts m as delivered to the reader's connection.
func (r *Reader) Delivered(m Message) {
	if r.peer {
		r.t.toRelays.Add(1)
		r.t.toRelaysBytes.Add(int64(len(m.Data)))
		return
	}
	r.t.toUsers.Add(1)
	r.t.toUsersBytes.Add(int64(len(m.Data)))
}

// Lagged cuts the reader because its connection took longer than MaxLag
// to take a message.
func (r *Reader) Lagged() error {
	err := fmt.Errorf("%w: the connection took more than %s to take a message", ErrLagging, r.t.hub.cfg.MaxLag)
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.readers[r]; ok {
		t.cut.Add(1)
	}
	r.cut(err)
	t.removeLocked(r)
	return err
}

// Dropped returns how many messages the reader lost.
func (r *Reader) Dropped() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

// Leave ends the reader.
func (r *Reader) Leave() {
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeLocked(r)
}

// CloseDevice ends every reader and writer of device's topics on this
// relay with err (ErrCancelled: an operator's cancel) and returns how
// many.
func (h *Hub) CloseDevice(device string, err error) int {
	n := 0
	for _, t := range h.deviceTopics(device) {
		t.mu.Lock()
		n += t.cutLocked(err, false)
		t.mu.Unlock()
	}
	return n
}

// Moved follows device to its new holder: this relay ends the copies of
// device's topics it feeds other relays, and ends its writers (they
// reconnect, and are sent on to the new holder), and feeds its own
// readers from the new holder. It returns how many connections it ended.
func (h *Hub) Moved(device string) int {
	n := 0
	for _, t := range h.deviceTopics(device) {
		t.mu.Lock()
		n += t.cutLocked(ErrMoved, true) + t.endWritersLocked(ErrMoved)
		if t.stopFeed != nil {
			t.stopFeed()
			t.stopFeed = nil
		}
		if t.users > 0 {
			t.startFeedLocked()
		}
		t.releaseLocked()
		t.mu.Unlock()
	}
	return n
}

func (h *Hub) deviceTopics(device string) []*Topic {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*Topic
	for k, t := range h.topics {
		if k.Device == device {
			out = append(out, t)
		}
	}
	return out
}

// Close ends every topic's readers and writers with ErrClosed, stops the
// feeds and waits for them.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	all := make([]*Topic, 0, len(h.topics))
	for _, t := range h.topics {
		all = append(all, t)
	}
	h.mu.Unlock()
	for _, t := range all {
		t.mu.Lock()
		t.cutLocked(ErrClosed, false)
		if t.stopFeed != nil {
			t.stopFeed()
			t.stopFeed = nil
		}
		t.mu.Unlock()
	}
	h.wg.Wait()
}
