// Package mux carries many byte streams over one connection: the framing
// of Switchboard's tunnel (switchboard-tunnel/2), where the relay opens a
// stream to one of an agent's services and each end copies bytes.
//
// A Session wraps a net.Conn. Either end may Open a stream, with metadata
// the other end reads from Accept; each Stream is a net.Conn of its own
// with deadlines, half-close (CloseWrite) and Reset. Opening costs no
// round trip: the opener may write at once.
//
// What it costs, and why:
//   - No goroutine per stream or per frame. A session has one reading
//     goroutine; writes are made by the goroutine that has something to
//     write, which also writes whatever other streams queued meanwhile, so
//     that frames of many streams go out in one system call. A goroutine
//     is started only to send control frames when no one is writing.
//   - Memory only while bytes move. Unread bytes sit in pooled chunks; an
//     idle session over TCP on Linux holds no read buffer, since it waits
//     for the socket to become readable before taking one, and no
//     goroutine: one goroutine of the process's waits for the sockets of
//     all of them (see park_linux.go).
//   - Flow control per stream: a stream starts with InitialWindow of
//     credit, and the receiver grants more as the application reads. The
//     window grows, up to Config.MaxWindow, when the session measures a
//     larger bandwidth-delay product (bytes received in one ping's round
//     trip), so that one stream can fill a long fat link.
//
// Sequence for an opener (the relay):
//
//	s := mux.New(conn, mux.Config{})
//	st, err := s.Open(ctx, meta)   // st.Write at once; st.Read the answer
//
// and for an acceptor (the agent):
//
//	s := mux.New(conn, mux.Config{Client: true})
//	for { st, err := s.Accept(); … go serve(st) }
package mux

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config's zero values.
const (
	DefaultMaxWindow     = 4 << 20
	DefaultAcceptBacklog = 1024
	DefaultWriteFrame    = 64 << 10
)

// Config sets up a Session. The zero value is a server end that accepts
// streams, with the defaults named in each field.
type Config struct {
	// Client is set on the end that dialled the connection: its streams
	// have odd ids, the other end's even ones.
	Client bool
	// RefuseStreams makes the session refuse every stream the peer opens.
	RefuseStreams bool
	// MaxWindow bounds a stream's receive window as it grows: the most a
	// stream buffers for a reader that does not read. Default 4 MiB: a 100
	// Mbit/s link with a 300 ms round trip, or 1 Gbit/s with 30 ms.
	MaxWindow int
	// WriteFrame is the largest DATA frame this end writes. Default 64 KiB.
	WriteFrame int
	// AcceptBacklog is how many opened streams may wait for Accept; more
	// are refused (CodeRefused). Default 1024.
	AcceptBacklog int
	// PingAfter, if set, sends a ping when nothing was read for that long.
	PingAfter time.Duration
	// DeadAfter, if set, closes the session with ErrTimeout when nothing
	// was read for that long.
	DeadAfter time.Duration
	// OnGoAway, if set, is called when the peer sends GOAWAY, from the
	// goroutine that reads the connection: it must not block.
	OnGoAway func()
}

func (c *Config) complete() {
	if c.MaxWindow <= 0 {
		c.MaxWindow = DefaultMaxWindow
	}
	c.MaxWindow = min(max(c.MaxWindow, InitialWindow), maxCredit)
	if c.WriteFrame <= 0 {
		c.WriteFrame = DefaultWriteFrame
	}
	c.WriteFrame = min(c.WriteFrame, MaxFrame)
	if c.AcceptBacklog <= 0 {
		c.AcceptBacklog = DefaultAcceptBacklog
	}
}

// Session is one end of a multiplexed connection.
type Session struct {
	conn net.Conn
	// sock is what the session reads and writes: conn, or the socket
	// beneath conn's Transparent wrappers, which sawRead (nil for a bare
	// conn) tells of each read.
	sock    net.Conn
	sawRead func(n int, err error)
	cfg     Config
	w       writer
	raw     *rawReader // reads the socket holding no buffer while idle; nil if it cannot

	acceptable chan struct{} // signalled when a stream is queued for Accept; nil when streams are refused
	done       chan struct{}
	reading    sync.WaitGroup // the reading goroutine, and those it hands off to

	lastRead atomic.Int64 // when the last read was, by clock()
	window   atomic.Int64 // the receive window a stream grants up to now

	mu       sync.Mutex         // guards the fields below
	streams  map[uint32]*Stream // nil while there are none
	nextID   uint32             // the id of the next stream this end opens
	peerID   uint32             // the highest id the peer opened
	pingSeq  uint32
	goneAway atomic.Bool              // the peer accepts no new streams; set under mu, read without it by GoneAway
	peerAway chan struct{}            // PeerGoneAway's; made when first asked for
	err      error                    // why the session ended; nil while it runs
	backlog  []*Stream                // streams the peer opened, waiting for Accept
	pings    map[uint32]chan struct{} // Ping's, waiting for their answers; nil while none wait
	bdp      *bdpProbe                // made with the first DATA bytes
	streamAt time.Duration            // when the last stream was added (or the session began), by clock()
	live     *time.Timer
	after    []func() // AfterFunc's, run when the session ends
}

// bdpProbe measures the bytes received during one ping's round trip.
type bdpProbe struct {
	out    bool          // a probe's ping is on its way
	probes uint32        // probes started (wrapping: for tests)
	sent   time.Duration // when, by clock()
	bytes  int           // DATA bytes received since, or since the last probe's answer while none is out
	rtt    time.Duration
}

// bdpPing is the value of the pings that measure the bandwidth-delay
// product; the values of Ping's pings stay below it.
const bdpPing = 1 << 31

// New starts a session over conn. The session owns conn from then on:
// Close closes it.
func New(conn net.Conn, cfg Config) *Session {
	cfg.complete()
	// What an idle session holds is allocated as it is needed: the maps
	// of streams and pings when there are some, Accept's signal when the
	// peer may open streams, PeerGoneAway's channel when asked for, the
	// writer's batches while it writes.
	s := &Session{
		conn:     conn,
		cfg:      cfg,
		done:     make(chan struct{}),
		streamAt: clock(),
		nextID:   2,
	}
	if cfg.Client {
		s.nextID = 1
	}
	if !cfg.RefuseStreams {
		s.acceptable = make(chan struct{}, 1)
	}
	s.sock, s.sawRead = socketOf(conn)
	s.window.Store(InitialWindow)
	s.w.init(s)
	if s.raw = newRawReader(s.sock, s.sawRead); s.raw != nil {
		s.raw.idle = s.idle
	}
	s.touch()
	s.reading.Add(1)
	go s.readLoop()
	if cfg.PingAfter > 0 || cfg.DeadAfter > 0 {
		s.mu.Lock()
		s.live = time.AfterFunc(s.nextLivenessCheck(), s.checkLiveness)
		s.mu.Unlock()
	}
	return s
}

// Open opens a stream whose peer reads meta from Accept. It costs no round
// trip: the OPEN frame goes out with the stream's first write (or before
// its first read), and a refusal shows as a *ResetError from its reads and
// writes.
func (s *Session) Open(ctx context.Context, meta []byte) (*Stream, error) {
	if len(meta) > MaxOpen {
		return nil, protocolErrorf("metadata of %d bytes, over the limit of %d", len(meta), MaxOpen)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	switch {
	case s.err != nil:
		err := s.err
		s.mu.Unlock()
		return nil, err
	case s.goneAway.Load():
		s.mu.Unlock()
		return nil, ErrGoAway
	case s.nextID >= 1<<31:
		s.mu.Unlock()
		return nil, ErrStreamsExhausted
	}
	st := newStream(s, s.nextID, nil)
	st.opening = true
	st.open = append([]byte(nil), meta...)
	s.nextID += 2
	s.addLocked(st)
	s.mu.Unlock()
	return st, nil
}

// Accept returns the next stream the peer opened.
func (s *Session) Accept() (*Stream, error) {
	for {
		s.mu.Lock()
		if len(s.backlog) > 0 {
			st := s.backlog[0]
			s.backlog[0] = nil
			s.backlog = s.backlog[1:]
			if len(s.backlog) == 0 {
				s.backlog = nil // hold no array while none wait
			}
			s.mu.Unlock()
			return st, nil
		}
		err := s.err
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-s.acceptable:
		case <-s.done:
		}
	}
}

// Ping sends a ping and waits for its answer: the round-trip time.
func (s *Session) Ping(ctx context.Context) (time.Duration, error) {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return 0, err
	}
	s.pingSeq = (s.pingSeq + 1) % bdpPing
	id := s.pingSeq
	answered := make(chan struct{})
	if s.pings == nil {
		s.pings = map[uint32]chan struct{}{}
	}
	s.pings[id] = answered
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pings, id)
		if len(s.pings) == 0 {
			s.pings = nil
		}
		s.mu.Unlock()
	}()
	sent := time.Now()
	if err := s.w.control(header{typ: typePing, value: id}, nil); err != nil {
		return 0, err
	}
	select {
	case <-answered:
		return time.Since(sent), nil
	case <-s.done:
		return 0, s.Err()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// GoneAway reports whether the peer sent GOAWAY: Open fails with
// ErrGoAway.
func (s *Session) GoneAway() bool { return s.goneAway.Load() }

// PeerGoneAway is closed when the peer sends GOAWAY: it opens no more
// streams on this session, whose streams open finish as they would.
func (s *Session) PeerGoneAway() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peerAway == nil {
		s.peerAway = make(chan struct{})
		if s.goneAway.Load() {
			close(s.peerAway)
		}
	}
	return s.peerAway
}

// GoAway tells the peer to open no more streams here; the streams open
// now carry on. The code is the application's.
func (s *Session) GoAway(code uint32) error {
	return s.w.control(header{typ: typeGoAway, value: code}, nil)
}

// NumStreams reports the streams open now.
func (s *Session) NumStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// Done is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.done }

// AfterFunc arranges for f to run in a goroutine of its own once the
// session has ended (at once if it has), so that whoever must act on the
// end need not keep a goroutine waiting on Done for the session's life.
func (s *Session) AfterFunc(f func()) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		go f()
		return
	}
	s.after = append(s.after, f)
	s.mu.Unlock()
}

// Err reports why the session ended, or nil while it runs.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// LocalAddr and RemoteAddr are the connection's.
func (s *Session) LocalAddr() net.Addr  { return s.conn.LocalAddr() }
func (s *Session) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }

// Close ends the session and every stream on it, and closes the
// connection. It waits for the reading goroutine to return. The session
// owns the connection: closing it otherwise leaves a parked session
// waiting until Close.
func (s *Session) Close() error {
	s.fail(ErrSessionClosed)
	s.reading.Wait()
	s.w.waitIdle()
	return nil
}

// fail ends the session with err (the first error wins).
func (s *Session) fail(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	streams := s.streams
	s.streams = nil
	if s.live != nil {
		s.live.Stop()
	}
	after := s.after
	s.after = nil
	s.mu.Unlock()
	close(s.done)
	parked := s.unpark() // before the socket is closed, while its number names it
	s.conn.Close()
	s.w.fail(err)
	for _, st := range streams {
		st.fail(err)
	}
	for _, f := range after {
		go f()
	}
	if parked {
		s.reading.Done() // the reader ends here, as it would on its read's error
	}
}

// touch records that something was read now.
func (s *Session) touch() { s.lastRead.Store(int64(clock())) }

// epoch is what clock counts from.
var epoch = time.Now()

// clock is a monotonic time, as a Duration since the process began: 8
// bytes where a time.Time takes 24 in every session.
func clock() time.Duration { return time.Since(epoch) }

func (s *Session) silentFor() time.Duration {
	return clock() - time.Duration(s.lastRead.Load())
}

// nextLivenessCheck is how long until the next ping or timeout is due.
func (s *Session) nextLivenessCheck() time.Duration {
	silent := s.silentFor()
	next := time.Duration(1<<63 - 1)
	if d := s.cfg.PingAfter; d > 0 {
		if d > silent {
			next = d - silent
		} else {
			next = d // pinged already: check again after as long
		}
	}
	if d := s.cfg.DeadAfter; d > 0 {
		next = min(next, max(d-silent, time.Millisecond))
	}
	return next
}

func (s *Session) checkLiveness() {
	silent := s.silentFor()
	if d := s.cfg.DeadAfter; d > 0 && silent >= d {
		s.fail(ErrTimeout)
		return
	}
	if d := s.cfg.PingAfter; d > 0 && silent >= d {
		s.w.control(header{typ: typePing, value: 0}, nil) // its answer is a read: that suffices
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.live.Reset(s.nextLivenessCheck())
	}
}

// addLocked adds a stream.
func (s *Session) addLocked(st *Stream) {
	if s.streams == nil {
		s.streams = map[uint32]*Stream{}
	}
	s.streams[st.id] = st
	s.streamAt = clock()
}

// handOffAfter is how long a session carries no stream before a read
// that finds its socket empty parks it, or where it cannot, its reader
// waits in a fresh goroutine after each read (see readLoop): long enough
// that a session serving requests one after another keeps its reader.
var handOffAfter = time.Second

// idle reports whether the session has no stream now and has had none
// added for handOffAfter; if it has none but had one added more recently,
// also how long until it has had none for handOffAfter.
func (s *Session) idle() (bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streams != nil || len(s.backlog) > 0 || s.err != nil {
		return false, 0
	}
	if quiet := clock() - s.streamAt; quiet < handOffAfter {
		return false, handOffAfter - quiet
	}
	return true, 0
}

// removeLocked forgets a stream that is done both ways. The map goes with
// the last stream, so that a burst's many streams are not paid for once
// they are gone.
func (s *Session) removeLocked(id uint32) {
	delete(s.streams, id)
	if len(s.streams) == 0 {
		s.streams = nil
	}
}

func (s *Session) remove(id uint32) {
	s.mu.Lock()
	s.removeLocked(id)
	s.mu.Unlock()
}
