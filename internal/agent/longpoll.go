package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/backoff"
	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// errStop ends a response: the relay no longer wants it (400/410).
var errStop = errors.New("relay no longer wants this response")

// runLongPoll runs NumPendingRequests poll loops and waits for every request
// they started.
func (a *Agent) runLongPoll(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for range a.cfg.NumPendingRequests {
		wg.Go(func() {
			if err := a.pollLoop(ctx, &wg); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// pollLoop polls for requests and starts a handler for each; handlers join wg.
func (a *Agent) pollLoop(ctx context.Context, wg *sync.WaitGroup) error {
	bo := backoff.New(backoff.Policy{})
	relay := 0
	failedInRow := 0 // relays that failed one after another
	for ctx.Err() == nil {
		msg, err := a.poll(ctx, a.cfg.Relays[relay])
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrUnauthorized):
			a.setState("refused", logkey.Err, err)
			return err
		case errors.Is(err, errNoRequest):
			failedInRow = 0
			bo.Up(time.Now())
			a.setState("connected", logkey.Relay, a.cfg.Relays[relay].Redacted(), logkey.Protocol, ProtocolLongPoll)
			continue
		case err != nil:
			a.setState("disconnected", logkey.Relay, a.cfg.Relays[relay].Redacted(), logkey.Err, err)
			relay = (relay + 1) % len(a.cfg.Relays)
			// Another relay is tried at once; only a round of failures
			// backs off.
			if failedInRow++; failedInRow < len(a.cfg.Relays) {
				continue
			}
			failedInRow = 0
			if !sleep(ctx, bo.Next(time.Now())) {
				return nil
			}
			continue
		}
		failedInRow = 0
		bo.Up(time.Now())
		a.setState("connected", logkey.Relay, a.cfg.Relays[relay].Redacted(), logkey.Protocol, ProtocolLongPoll)
		base := a.cfg.Relays[relay]
		wg.Go(func() { a.handle(ctx, base, msg) })
	}
	return nil
}

// errNoRequest: the poll ended without a request (408); poll again at once.
var errNoRequest = errors.New("no request within the poll wait")

// poll makes one long poll and returns the request it carried.
func (a *Agent) poll(ctx context.Context, relay *url.URL) (*wire.Request, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.PollTimeout)
	defer cancel()
	u := a.endpoint(relay, "/server/request", url.Values{"server": {a.cfg.Device}})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	a.authorize(req)
	resp, err := a.relay.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusRequestTimeout:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, errNoRequest
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, fmt.Errorf("%w: %s", ErrUnauthorized, statusMessage(resp))
	default:
		return nil, fmt.Errorf("poll: %s", statusMessage(resp))
	}
	body, err := readBody(resp, a.cfg.MaxRequestBytes)
	if err != nil {
		return nil, fmt.Errorf("poll: read request: %w", err)
	}
	msg, err := wire.UnmarshalRequest(body, a.cfg.MaxRequestBytes)
	if err != nil {
		return nil, fmt.Errorf("poll: %w", err)
	}
	if msg.ID == "" {
		// Nothing to answer to: not a request (an empty 200 from a proxy
		// on the way, say). Poll again rather than call the backend.
		return nil, fmt.Errorf("poll: the relay answered 200 without a request (%d bytes, no request id)", len(body))
	}
	return msg, nil
}

// readBody reads a response body of at most limit bytes (one more tells the
// decoder it is too large), in one allocation when its length is declared.
func readBody(resp *http.Response, limit int) ([]byte, error) {
	n := resp.ContentLength
	if n < 0 || n > int64(limit) {
		return io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	}
	buf := make([]byte, n)
	_, err := io.ReadFull(resp.Body, buf)
	return buf, err
}

// handle forwards one request to the backend and streams the answer back.
func (a *Agent) handle(ctx context.Context, relay *url.URL, msg *wire.Request) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	s := &responder{a: a, id: msg.ID, start: start}
	s.relay.Store(relay)
	breq, err := a.backendRequest(ctx, msg)
	if err != nil {
		s.fail(ctx, http.StatusBadRequest, "Bad request for the backend: "+err.Error())
		return
	}
	resp, err := a.backend.Do(breq)
	if err != nil {
		s.fail(ctx, http.StatusBadGateway, "Backend request failed: "+err.Error())
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		s.upgraded(ctx, resp)
		return
	}
	s.stream(ctx, resp)
}

// backendRequest turns a relayed request into a request to the backend.
func (a *Agent) backendRequest(ctx context.Context, msg *wire.Request) (*http.Request, error) {
	in, err := url.Parse(msg.URL)
	if err != nil {
		return nil, fmt.Errorf("bad url %q: %w", msg.URL, err)
	}
	out := *a.cfg.Backend
	out.Path = strings.TrimSuffix(out.Path, "/") + in.Path
	if in.RawPath != "" || out.RawPath != "" {
		out.RawPath = strings.TrimSuffix(a.cfg.Backend.EscapedPath(), "/") + in.EscapedPath()
	}
	out.RawQuery = in.RawQuery
	out.Fragment = ""
	req, err := http.NewRequestWithContext(ctx, msg.Method, out.String(), bytes.NewReader(msg.Body))
	if err != nil {
		return nil, err
	}
	wire.AddToHTTP(req.Header, msg.Header)
	req.ContentLength = int64(len(msg.Body))
	if len(msg.Body) == 0 {
		req.Body, req.GetBody = http.NoBody, nil
		if streamsBody(req.Header) {
			req.Body = presentEmptyBody{}
			req.GetBody = func() (io.ReadCloser, error) { return presentEmptyBody{}, nil }
		}
	}
	if a.cfg.PreserveHost && msg.Host != "" {
		req.Host = msg.Host
	}
	return req, nil
}

// streamsBody reports whether h is a request of a protocol whose body is a
// stream that must be ended, even when empty: gRPC, or anything asking for
// trailers. An HTTP/2 server of such a protocol may wait for a DATA frame
// that ends the stream (a gRPC client stream of no messages is one), which
// a request without a body never sends.
func streamsBody(h http.Header) bool {
	ct := h.Get("Content-Type")
	if ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;") {
		return true
	}
	for _, te := range h.Values("Te") {
		for tok := range strings.SplitSeq(te, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "trailers") {
				return true
			}
		}
	}
	return false
}

// presentEmptyBody is a request body that is empty but present. Unlike
// http.NoBody, with which the HTTP/2 transport ends the stream on the HEADERS
// frame, it makes the transport send an empty DATA frame that ends it; over
// HTTP/1.1 it goes as an empty chunked body.
type presentEmptyBody struct{}

func (presentEmptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (presentEmptyBody) Close() error             { return nil }

// relaysFrom returns the configured relays, first the one given.
func (a *Agent) relaysFrom(first *url.URL) []*url.URL {
	out := []*url.URL{first}
	for _, r := range a.cfg.Relays {
		if r != first {
			out = append(out, r)
		}
	}
	return out
}

// endpoint builds the URL of an agent endpoint on relay.
func (a *Agent) endpoint(relay *url.URL, path string, q url.Values) string {
	u := *relay
	u.Path = strings.TrimSuffix(u.Path, "/") + a.cfg.RelayPrefix + path
	u.RawQuery = q.Encode()
	return u.String()
}

func (a *Agent) authorize(req *http.Request) {
	if a.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.cfg.Token)
	}
	req.Header.Set(wire.InstanceHeader, a.instance)
}

// statusMessage renders a relay's error answer for logs.
func statusMessage(resp *http.Response) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
}

// sleep waits d or until ctx ends, reporting whether it waited the whole d.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
