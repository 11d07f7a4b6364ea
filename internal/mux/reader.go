package mux

import (
	"io"
)

// readLoop reads and acts on frames until the connection fails or the
// session ends. A session that has carried no stream for a while holds no
// goroutine while its socket is empty: on Linux it is parked (see
// park_linux.go), and its reader starts again in a fresh goroutine when
// bytes come; the reading WaitGroup counts the reader as running while
// it is parked. Where it cannot be parked, it waits for its next bytes in
// a fresh goroutine, which takes over from the one that read the last: an
// idle session so holds one goroutine whose stack is small, where the
// reader would keep the stack it grew acting on frames (until the runtime
// shrinks it, if it ever does).
func (s *Session) readLoop() {
	err := s.readFrames()
	if err == errIdle {
		if !s.raw.noPark && s.park() {
			return
		}
		s.raw.noPark = true
		go s.readLoop()
		return
	}
	defer s.reading.Done()
	if err == io.EOF {
		err = ErrSessionClosed
	}
	s.fail(err)
}

// largePayload is the size from which a payload not yet wholly in the read
// buffer is read straight into a chunk of its own.
const largePayload = readBufSize / 4

func (s *Session) readFrames() error {
	raw := s.raw // nil where the socket cannot be read without a buffer held
	if raw != nil {
		raw.begin()
	}
	var buf []byte
	defer func() {
		if buf != nil {
			putChunk(buf)
		}
	}()
	r, w := 0, 0 // buf[r:w] is read and not yet acted on
	for {
		for w-r >= headerLen {
			h, err := parseHeader(buf[r:w])
			if err != nil {
				return err
			}
			n := h.payloadLen()
			have := w - r - headerLen
			if have >= n {
				if err := s.handle(h, buf[r+headerLen:r+headerLen+n], false); err != nil {
					return err
				}
				r += headerLen + n
				continue
			}
			if n < largePayload {
				break // wait for the rest in buf
			}
			payload := getChunk(n)
			copy(payload, buf[r+headerLen:w])
			if _, err := io.ReadFull(sessionReader{s}, payload[have:]); err != nil {
				putChunk(payload)
				return err
			}
			s.touch()
			r, w = 0, 0
			if err := s.handle(h, payload, true); err != nil {
				return err
			}
		}
		switch {
		case r == w:
			r, w = 0, 0
		case r > 0:
			w = copy(buf, buf[r:w])
			r = 0
		}
		var n int
		var err error
		if raw != nil {
			buf, n, err = raw.read(buf, w)
		} else {
			if buf == nil {
				buf = getChunk(readBufSize)
			}
			n, err = s.read(buf[w:])
		}
		if n > 0 {
			w += n
			s.touch()
			continue // act on what came before reporting an error
		}
		if err != nil {
			return err
		}
	}
}

// handle acts on one frame. The payload is the read buffer's unless owned.
func (s *Session) handle(h header, payload []byte, owned bool) error {
	switch h.typ {
	case typeData:
		return s.handleData(h, payload, owned)
	case typeOpen:
		return s.handleOpen(h, payload)
	case typeWindow:
		st, err := s.lookup(h.stream)
		if st != nil && st.addCredit(h.value) {
			return protocolErrorf("stream %d granted over %d bytes", h.stream, maxCredit)
		}
		return err
	case typeReset:
		st, err := s.lookup(h.stream)
		if st != nil {
			s.remove(st.id)
			st.fail(&ResetError{Code: h.value, Remote: true})
		}
		return err
	case typePing:
		if h.flags&flagAck == 0 {
			s.w.control(header{typ: typePing, flags: flagAck, value: h.value}, nil)
			return nil
		}
		s.pong(h.value)
	case typeGoAway:
		s.mu.Lock()
		first := !s.goneAway.Load()
		if first && s.peerAway != nil {
			close(s.peerAway)
		}
		s.goneAway.Store(true)
		s.mu.Unlock()
		if first && s.cfg.OnGoAway != nil {
			s.cfg.OnGoAway()
		}
	}
	return nil
}

// lookup returns the stream id names, or nil if it has ended; an id that
// names no stream that ever was is a protocol error.
func (s *Session) lookup(id uint32) (*Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.streams[id]; ok {
		return st, nil
	}
	ours := (id%2 == 1) == s.cfg.Client
	if ours && id < s.nextID || !ours && id <= s.peerID {
		return nil, nil // ended: late frames are dropped
	}
	return nil, protocolErrorf("frame for stream %d, which was never opened", id)
}

func (s *Session) handleData(h header, payload []byte, owned bool) error {
	st, err := s.lookup(h.stream)
	if st == nil {
		if owned {
			putChunk(payload)
		}
		return err
	}
	if len(payload) > 0 {
		s.probeBDP(len(payload))
	} else if owned {
		putChunk(payload)
		payload = nil
	}
	if st.receive(payload, owned, h.flags&flagFin != 0) {
		st.Reset(CodeFlowControl)
	}
	return nil
}

func (s *Session) handleOpen(h header, meta []byte) error {
	ours := (h.stream%2 == 1) == s.cfg.Client
	s.mu.Lock()
	if _, open := s.streams[h.stream]; ours || open {
		s.mu.Unlock()
		return protocolErrorf("OPEN of stream %d, which the peer may not open", h.stream)
	}
	// Streams are opened by their first frame, so OPENs of streams opened
	// at once may come in any order; a stream's other frames follow its OPEN.
	s.peerID = max(s.peerID, h.stream)
	refuse := s.cfg.RefuseStreams || s.err != nil
	var st *Stream
	if !refuse {
		st = newStream(s, h.stream, append([]byte(nil), meta...))
		st.rfin = h.flags&flagFin != 0
		if len(s.backlog) < s.cfg.AcceptBacklog {
			s.backlog = append(s.backlog, st)
			s.addLocked(st)
		} else {
			refuse = true // the backlog is full
		}
	}
	s.mu.Unlock()
	signal(s.acceptable)
	if refuse {
		s.w.control(header{typ: typeReset, stream: h.stream, value: CodeRefused}, nil)
	}
	return nil
}

// probeBDP counts n bytes received and starts a measurement of the
// bandwidth-delay product if none is running, the window may grow, and a
// quarter of the window arrived since the last one: a stream that fills
// the window brings that much in a quarter of a round trip, so its
// measurements follow each other as before, while small requests and
// answers, whose round trip could never fill the window, cost a ping every
// window/4 bytes rather than one per round trip, each a frame written on a
// goroutine of its own at both ends.
func (s *Session) probeBDP(n int) {
	s.mu.Lock()
	if s.bdp == nil {
		s.bdp = new(bdpProbe) // with the first bytes: an idle session holds none
	}
	b := s.bdp
	b.bytes += n
	window := s.window.Load()
	start := !b.out && window < int64(s.cfg.MaxWindow) && int64(b.bytes) >= window/4
	if start {
		b.out = true
		b.sent = clock()
		b.bytes = n
		b.probes++
	}
	s.mu.Unlock()
	if start {
		s.w.control(header{typ: typePing, value: bdpPing}, nil)
	}
}

// pong acts on a ping's answer.
func (s *Session) pong(value uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if value != bdpPing {
		if c, ok := s.pings[value]; ok {
			close(c)
			delete(s.pings, value)
		}
		return
	}
	b := s.bdp
	if b == nil || !b.out {
		return
	}
	b.out = false
	b.rtt = clock() - b.sent
	// What arrived during one round trip is what the link holds. When it
	// nears the window, the window is what limits the stream: double it.
	window := s.window.Load()
	if sample := int64(b.bytes); sample*3 >= window*2 {
		s.window.Store(min(2*sample, int64(s.cfg.MaxWindow)))
	}
	b.bytes = 0 // the next probe waits for window/4 bytes more
}

// read reads the session's connection, telling its Transparent wrappers
// what the read returned.
func (s *Session) read(p []byte) (int, error) {
	for {
		n, err := s.sock.Read(p)
		if n == 0 && s.raw != nil && s.raw.kicked(err) {
			continue // a cut wait for idleness, not the peer's
		}
		if s.sawRead != nil {
			s.sawRead(n, err)
		}
		return n, err
	}
}

// sessionReader is the session's connection as an io.Reader, through
// Session.read.
type sessionReader struct{ s *Session }

func (r sessionReader) Read(p []byte) (int, error) { return r.s.read(p) }
