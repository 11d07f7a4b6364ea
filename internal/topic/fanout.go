package topic

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
)

// DefaultMaxPartBytes bounds one part of a shared HTTP stream when
// Fanout.MaxPartBytes is zero.
const DefaultMaxPartBytes = 8 << 20

// Fanout is an http.RoundTripper in front of a relay's transport to the
// devices that shares broadcast streams: a GET whose answer the device's
// agent marks with BroadcastHeader (its --broadcast-path) is fetched once
// by this relay and every other viewer's GET of the same path joins it,
// at the start of the next part: the next multipart boundary of an MJPEG
// stream, the next event of server-sent events, the next line of
// anything else. Each viewer reads through a reader of Hub, so a slow
// viewer loses whole parts (whole frames, whole events) and never slows
// the others. The shared fetch ends when its last viewer leaves or the
// device ends the stream.
//
// A relay's shared fetch of a device held elsewhere is itself a viewer of
// the holder's shared fetch: the device serves each stream once, and the
// holder sends one copy to each relay with viewers.
type Fanout struct {
	// Next carries requests to the devices. Required.
	Next http.RoundTripper
	// Hub holds the shared streams' readers: a hub of its own, with no
	// Link. Required.
	Hub *Hub
	// Admit is called for a request that joins a running stream instead
	// of reaching its device (to spend its access code); its error, with
	// an HTTPStatus() int method, refuses the request. Nil admits all.
	Admit func(*http.Request) error
	// Forwarded reports whether r came from another relay, which is told
	// the stream is a broadcast (users never see BroadcastHeader). Nil:
	// none is.
	Forwarded func(r *http.Request) bool
	// MaxPartBytes bounds a part; a longer one is passed on in pieces.
	// Default DefaultMaxPartBytes.
	MaxPartBytes int

	mu      sync.Mutex // guards streams
	streams map[streamID]*shared
	wg      sync.WaitGroup // the pumps
}

var _ http.RoundTripper = (*Fanout)(nil)

// streamID names a shared stream without building a string per request.
type streamID struct{ device, path, query string }

func idOf(req *http.Request) streamID {
	return streamID{req.URL.Host, req.URL.EscapedPath(), req.URL.RawQuery}
}

// shared is one stream fetched once and shared.
type shared struct {
	id     streamID
	key    Key // in the hub: the device, and the path and query as Name
	status int
	header http.Header
	body   io.ReadCloser
	cancel context.CancelFunc
	writer *Writer
	split  splitFunc
	views  int  // viewers reading it; guarded by Fanout.mu
	ended  bool // the device ended it; guarded by Fanout.mu
}

// errStreamEnded ends the viewers of a stream the device ended.
var errStreamEnded = errors.New("the device ended the stream")

// RoundTrip implements http.RoundTripper.
func (f *Fanout) RoundTrip(req *http.Request) (*http.Response, error) {
	if !shareable(req) {
		return f.pass(f.Next.RoundTrip(req))
	}
	id := idOf(req)
	if s := f.view(id); s != nil {
		if f.Admit != nil {
			if err := f.Admit(req); err != nil {
				f.unview(s)
				return nil, err
			}
		}
		return f.join(req, s)
	}
	// The fetch may outlive this viewer, once it turns out to be a
	// broadcast; until then it ends with the viewer.
	ctx, cancel := context.WithCancel(context.WithoutCancel(req.Context()))
	stop := context.AfterFunc(req.Context(), cancel)
	resp, err := f.Next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get(BroadcastHeader) == "" {
		resp.Body = &cancelBody{ReadCloser: resp.Body, stop: stop, cancel: cancel}
		return f.pass(resp, nil)
	}
	stop()
	s := f.start(id, req, resp, cancel)
	return f.join(req, s)
}

// shareable reports whether req may be served from a shared stream: a
// plain GET of the whole resource.
func shareable(req *http.Request) bool {
	return req.Method == http.MethodGet && (req.Body == nil || req.Body == http.NoBody) &&
		req.Header.Get("Upgrade") == "" && req.Header.Get("Range") == ""
}

// pass hands on an answer that is not shared, without the marker.
func (f *Fanout) pass(resp *http.Response, err error) (*http.Response, error) {
	if resp == nil {
		return resp, err
	}
	if _, marked := resp.Header[BroadcastHeader]; marked && (f.Forwarded == nil || !f.Forwarded(resp.Request)) {
		resp.Header.Del(BroadcastHeader)
	}
	return resp, err
}

// view returns the running stream id with one more viewer, or nil.
func (f *Fanout) view(id streamID) *shared {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.streams[id]
	if s != nil {
		s.views++
	}
	return s
}

// unview counts a viewer gone; the last one ends the fetch.
func (f *Fanout) unview(s *shared) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.views--; s.views > 0 {
		return
	}
	if f.streams[s.id] == s {
		delete(f.streams, s.id)
	}
	s.cancel()
}

// start shares the stream resp, whose first viewer is its requester
// req. Another viewer's fetch of id that turned out a broadcast meanwhile
// is joined instead, and resp closed.
func (f *Fanout) start(id streamID, req *http.Request, resp *http.Response, cancel context.CancelFunc) *shared {
	key := Key{Device: id.device, Name: req.URL.RequestURI()}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.streams[id]; s != nil {
		s.views++
		cancel()
		resp.Body.Close()
		return s
	}
	w, err := f.Hub.Write(key)
	if err != nil { // the hub is closed: the relay stops
		cancel()
		resp.Body.Close()
		return nil
	}
	h := resp.Header.Clone()
	h.Del("Content-Length")
	// The device answered one viewer's request: what it set for that
	// viewer is not for the others.
	h.Del("Set-Cookie")
	s := &shared{id: id, key: key, status: resp.StatusCode, header: h, body: resp.Body, cancel: cancel, writer: w, split: splitterFor(h.Get("Content-Type")), views: 1}
	if f.streams == nil {
		f.streams = map[streamID]*shared{}
	}
	f.streams[id] = s
	return s
}

// join answers req from s, at its next part. s is counted a viewer for
// req already.
func (f *Fanout) join(req *http.Request, s *shared) (*http.Response, error) {
	if s == nil {
		return nil, ErrClosed
	}
	r, err := f.Hub.Join(s.key, false)
	if err != nil {
		f.unview(s)
		return nil, err
	}
	f.mu.Lock()
	ended := s.ended
	f.mu.Unlock()
	if ended { // between finding it and joining: fetch anew
		r.Leave()
		f.unview(s)
		return f.RoundTrip(req)
	}
	f.pumpOnce(s)
	h := s.header.Clone()
	if f.Forwarded == nil || !f.Forwarded(req) {
		h.Del(BroadcastHeader)
	}
	return &http.Response{
		Status: http.StatusText(s.status), StatusCode: s.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, ContentLength: -1, Request: req,
		Body: &viewBody{ctx: req.Context(), r: r, done: func() { r.Leave(); f.unview(s) }},
	}, nil
}

// pumpOnce starts reading s from the device, once its first viewer is
// there to see the first part.
func (f *Fanout) pumpOnce(s *shared) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.body == nil {
		return
	}
	body := s.body
	s.body = nil
	f.wg.Go(func() { f.pump(s, body) })
}

// pump reads the device's stream and publishes it part by part.
func (f *Fanout) pump(s *shared, body io.ReadCloser) {
	defer body.Close()
	limit := f.MaxPartBytes
	if limit <= 0 {
		limit = DefaultMaxPartBytes
	}
	var pending []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := body.Read(chunk)
		pending = append(pending, chunk[:n]...)
		for {
			k := s.split(pending)
			if k == 0 && len(pending) >= limit {
				k = len(pending)
			}
			if k == 0 {
				break
			}
			s.writer.Publish(Message{Binary: true, Data: bytes.Clone(pending[:k])})
			pending = pending[k:]
		}
		if err != nil {
			if len(pending) > 0 {
				s.writer.Publish(Message{Binary: true, Data: bytes.Clone(pending)})
			}
			f.mu.Lock()
			s.ended = true
			if f.streams[s.id] == s {
				delete(f.streams, s.id) // newcomers fetch anew
			}
			f.mu.Unlock()
			s.writer.End(errStreamEnded)
			return
		}
		pending = bytes.Clone(pending) // let the consumed prefix go
	}
}

// Close ends the pumps and waits for them; the hub ends the viewers.
func (f *Fanout) Close() {
	f.mu.Lock()
	for _, s := range f.streams {
		s.cancel()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// viewBody is one viewer's answer: the parts its reader gets.
type viewBody struct {
	ctx  context.Context
	r    *Reader
	done func()
	once sync.Once

	batch []Message
	cur   []byte
}

func (b *viewBody) Read(p []byte) (int, error) {
	for len(b.cur) == 0 {
		if len(b.batch) == 0 {
			var err error
			if b.batch, err = b.r.Next(b.ctx, b.batch[:0]); err != nil {
				if errors.Is(err, errStreamEnded) {
					return 0, io.EOF
				}
				return 0, err
			}
		}
		m := b.batch[0]
		b.r.Delivered(m)
		b.cur = m.Data
		b.batch = b.batch[1:]
	}
	n := copy(p, b.cur)
	b.cur = b.cur[n:]
	return n, nil
}

func (b *viewBody) Close() error {
	b.once.Do(b.done)
	return nil
}

// cancelBody ends a fetch that is not shared when its body is closed.
type cancelBody struct {
	io.ReadCloser
	stop   func() bool
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.stop()
	b.cancel()
	return err
}

// splitFunc returns the length of the first whole part at the start of
// buf, or 0 when buf holds none yet.
type splitFunc func(buf []byte) int

// splitterFor returns how parts of a stream of contentType end.
func splitterFor(contentType string) splitFunc {
	mt, params, _ := mime.ParseMediaType(contentType)
	switch {
	case strings.HasPrefix(mt, "multipart/") && params["boundary"] != "":
		return multipartSplitter(params["boundary"])
	case mt == "text/event-stream":
		return func(buf []byte) int {
			for i := 0; i+1 < len(buf); i++ {
				if buf[i] != '\n' {
					continue
				}
				if buf[i+1] == '\n' {
					return i + 2
				}
				if buf[i+1] == '\r' && i+2 < len(buf) && buf[i+2] == '\n' {
					return i + 3
				}
			}
			return 0
		}
	default:
		return func(buf []byte) int { return bytes.LastIndexByte(buf, '\n') + 1 }
	}
}

// multipartSplitter finds the parts of a multipart stream: a part whose
// headers give its Content-Length (as MJPEG cameras send) is whole as
// soon as its body is, so that a frame is passed on without waiting for
// the next; else the part ends at the line break before the next
// delimiter.
func multipartSplitter(boundary string) splitFunc {
	delim := []byte("\n--" + boundary)
	return func(buf []byte) int {
		if h := bytes.Index(buf, []byte("\r\n\r\n")); h >= 0 {
			if n, ok := partLength(buf[:h]); ok {
				end := h + 4 + n
				switch {
				case len(buf) < end:
					return 0
				case len(buf) >= end+2 && buf[end] == '\r' && buf[end+1] == '\n':
					return end + 2
				case len(buf) >= end+2:
					return end
				}
				return 0 // wait for the line break after the body
			}
		}
		if len(buf) < 2 {
			return 0
		}
		i := bytes.Index(buf[1:], delim)
		if i < 0 {
			return 0
		}
		return i + 2 // just after the '\n'; the next part starts at its "--"
	}
}

// partLength reads the Content-Length of a part's header block.
func partLength(head []byte) (int, bool) {
	for _, line := range bytes.Split(head, []byte("\r\n")) {
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !strings.EqualFold(string(bytes.TrimSpace(name)), "Content-Length") {
			continue
		}
		n := 0
		for _, c := range bytes.TrimSpace(value) {
			if c < '0' || c > '9' || n > 1<<30 {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, len(bytes.TrimSpace(value)) > 0
	}
	return 0, false
}
