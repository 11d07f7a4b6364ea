package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// responder posts one response to the relay, chunk by chunk.
type responder struct {
	a     *Agent
	relay atomic.Pointer[url.URL] // the relay the request came through, or the one that answered last
	id    string
	start time.Time
}

// call makes one of the agent's calls about this request, built for a relay
// by build: to the relay the request came through and, when that relay
// cannot be reached (it stopped, say), through the agent's other relays: a
// Switchboard relay passes such a call on to the relay that holds the
// request. A relay that answered stays the first choice for later calls.
func (s *responder) call(ctx context.Context, build func(relay *url.URL) (*http.Request, error)) (*http.Response, error) {
	relays := s.a.relaysFrom(s.relay.Load())
	for i, relay := range relays {
		req, err := build(relay)
		if err != nil {
			return nil, err
		}
		s.a.authorize(req)
		resp, err := s.a.relay.Do(req)
		if err == nil {
			if i > 0 {
				s.relay.Store(relay)
			}
			return resp, nil
		}
		var op *net.OpError
		if i+1 == len(relays) || ctx.Err() != nil || !errors.As(err, &op) || op.Op != "dial" {
			return nil, err
		}
	}
	return nil, errors.New("no relay to call") // relaysFrom returns at least one
}

// post sends one chunk. It returns errStop when the relay no longer wants
// the response (the user went away).
func (s *responder) post(ctx context.Context, m *wire.Response) error {
	m.ID = s.id
	body := m.Marshal()
	resp, err := s.call(ctx, func(relay *url.URL) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.a.endpoint(relay, "/server/response", nil), bytes.NewReader(body))
		if err == nil {
			req.Header.Set("Content-Type", wire.ContentTypeResponse)
		}
		return req, err
	})
	if err != nil {
		return fmt.Errorf("post response chunk: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 512))
		return nil
	case http.StatusBadRequest, http.StatusGone:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 512))
		return errStop
	default:
		return fmt.Errorf("post response chunk: %s", statusMessage(resp))
	}
}

// fail answers the request with an error of the agent's own.
func (s *responder) fail(ctx context.Context, status int, msg string) {
	s.a.cfg.Logger.Warn("request failed", logkey.Device, s.a.cfg.Device, logkey.RequestID, s.id, logkey.Err, msg)
	s.post(ctx, &wire.Response{
		HasStatus:         true,
		StatusCode:        int32(status),
		Header:            []wire.Header{{Name: "Content-Type", Value: "text/plain; charset=utf-8"}},
		Body:              []byte(msg + "\n"),
		EOF:               true,
		BackendDurationMS: time.Since(s.start).Milliseconds(),
	})
}

// head is the first chunk of resp: status and headers, with the trailers it
// announced named in a Trailer header so that the relay can announce them too.
func head(resp *http.Response) *wire.Response {
	h := resp.Header
	if len(resp.Trailer) > 0 {
		h = h.Clone()
		keys := make([]string, 0, len(resp.Trailer))
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		h.Set("Trailer", strings.Join(keys, ", "))
	}
	return &wire.Response{HasStatus: true, StatusCode: int32(resp.StatusCode), Header: wire.HeadersFromHTTP(h)}
}

// stream posts a backend response: in one chunk when its body is known to be
// small, else the head at once and the body as it arrives.
func (s *responder) stream(ctx context.Context, resp *http.Response) {
	first := head(resp)
	max := s.a.cfg.MaxChunkSize
	if resp.ContentLength >= 0 && resp.ContentLength <= int64(max) {
		body, err := io.ReadAll(io.LimitReader(resp.Body, int64(max)+1))
		if err == nil && len(body) <= max {
			first.Body, first.EOF = body, true
			first.Trailer = wire.HeadersFromHTTP(resp.Trailer)
			first.BackendDurationMS = time.Since(s.start).Milliseconds()
			s.post(ctx, first)
			return
		}
		first.Body = body
		if err != nil {
			s.finish(ctx, first, resp, err)
			return
		}
	}
	if err := s.post(ctx, first); err != nil {
		return
	}
	s.pump(ctx, resp.Body, resp)
}

// pump posts what body yields as it arrives: whatever is buffered goes out as
// soon as the previous post returns, so interactive streams see no timer delay
// and bulk transfers batch up to MaxChunkSize. After KeepAlive without data an
// empty chunk keeps the response alive. trailers come from resp when set.
func (s *responder) pump(ctx context.Context, body io.ReadCloser, resp *http.Response) {
	ctx, cancel := context.WithCancel(ctx)
	pieces := make(chan []byte, 8)
	var readErr error
	go func() {
		defer close(pieces)
		for {
			buf := make([]byte, min(s.a.cfg.BlockSize, s.a.cfg.MaxChunkSize))
			n, err := body.Read(buf)
			if n > 0 {
				select {
				case pieces <- buf[:n]:
				case <-ctx.Done():
					readErr = ctx.Err()
					return
				}
			}
			if err != nil {
				readErr = err
				return
			}
		}
	}()
	defer func() {
		cancel()
		body.Close()       // unblocks a Read that ignores ctx (an upgraded connection)
		for range pieces { // wait for the reader to stop
		}
	}()

	keep := time.NewTimer(s.a.cfg.KeepAlive)
	defer keep.Stop()
	var buf, carry []byte // carry: a piece that did not fit in the last chunk
	for {
		buf = append(buf[:0], carry...)
		carry = nil
		if len(buf) == 0 {
			select {
			case p, ok := <-pieces:
				if !ok {
					s.finish(ctx, &wire.Response{}, resp, readErr)
					return
				}
				buf = append(buf, p...)
			case <-keep.C:
				if s.post(ctx, &wire.Response{}) != nil {
					return
				}
				keep.Reset(s.a.cfg.KeepAlive)
				continue
			case <-ctx.Done():
				return
			}
		}
		closed := false
	drain:
		for {
			select {
			case p, ok := <-pieces:
				if !ok {
					closed = true
					break drain
				}
				if len(buf)+len(p) > s.a.cfg.MaxChunkSize {
					carry = p
					break drain
				}
				buf = append(buf, p...)
			default:
				break drain
			}
		}
		if closed {
			s.finish(ctx, &wire.Response{Body: buf}, resp, readErr)
			return
		}
		if s.post(ctx, &wire.Response{Body: buf}) != nil {
			return
		}
		keep.Reset(s.a.cfg.KeepAlive)
	}
}

// finish posts the last chunk m: trailers, timing, and an abort marker when
// the backend's body broke off with readErr.
func (s *responder) finish(ctx context.Context, m *wire.Response, resp *http.Response, readErr error) {
	m.EOF = true
	m.BackendDurationMS = time.Since(s.start).Milliseconds()
	if resp != nil {
		m.Trailer = wire.HeadersFromHTTP(resp.Trailer)
	}
	if readErr != nil && !errors.Is(readErr, io.EOF) {
		if ctx.Err() != nil {
			return // we were cancelled: nobody wants the end
		}
		s.a.cfg.Logger.Warn("backend response broke off", logkey.Device, s.a.cfg.Device, logkey.RequestID, s.id, logkey.Err, readErr)
		m.Trailer = append(m.Trailer, wire.Header{Name: wire.AbortTrailer, Value: "backend response broke off: " + readErr.Error()})
	}
	s.post(ctx, m)
}

// upgraded carries a 101 Switching Protocols: the head, then the backend's
// bytes as chunks while a second loop fetches the user's bytes.
func (s *responder) upgraded(ctx context.Context, resp *http.Response) {
	conn, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		s.fail(ctx, http.StatusBadGateway, "Backend switched protocols without a writable connection")
		return
	}
	if err := s.post(ctx, head(resp)); err != nil {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.userToBackend(ctx, conn)
	}()
	s.pump(ctx, conn, nil) // closes conn, which ends userToBackend's writes
	cancel()
	<-done
}

// userToBackend copies the user's bytes, fetched with requeststream calls,
// to the backend until the user closes its side or the stream ends.
func (s *responder) userToBackend(ctx context.Context, conn io.Writer) {
	q := url.Values{"id": {s.id}}
	for ctx.Err() == nil {
		resp, err := s.call(ctx, func(relay *url.URL) (*http.Request, error) {
			return http.NewRequestWithContext(ctx, http.MethodPost, s.a.endpoint(relay, "/server/requeststream", q), http.NoBody)
		})
		if err != nil {
			return
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			return // 410: the user closed its side; anything else ends the stream too
		}
		if len(data) > 0 {
			if _, err := conn.Write(data); err != nil {
				return
			}
		}
	}
}
