package longpoll_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/longpoll"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// splitReader returns its bytes in pieces of the sizes in splits (cycling,
// 0 read as 1), so that the handler sees a body arrive in parts.
type splitReader struct {
	b      []byte
	splits []byte
	i      int
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := len(r.b)
	if len(r.splits) > 0 {
		n = max(1, int(r.splits[r.i%len(r.splits)]))
		r.i++
	}
	n = min(n, len(p), len(r.b))
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// fuzzEnv is a handler over a real broker with the device "dev" known.
type fuzzEnv struct {
	broker  *broker.Broker
	handler http.Handler
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	b, err := broker.New(broker.Config{PollWait: 10 * time.Second, InactiveRequestTimeout: time.Minute})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(b.Close)
	e := &fuzzEnv{broker: b, handler: longpoll.NewHandler(longpoll.Config{Broker: b, Authorize: authorize, MaxChunkBytes: maxChunk})}
	// A poll whose agent went away at once makes the device known.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/server/request?server=dev", nil)
	req.Header.Set("Authorization", "Bearer agent-1")
	e.handler.ServeHTTP(httptest.NewRecorder(), req)
	if !slices.Contains(b.Devices(), "dev") {
		f.Fatal("the first poll did not make the device known")
	}
	return e
}

func (e *fuzzEnv) serve(method, target, token string, body io.Reader) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, body)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	e.handler.ServeHTTP(rec, req)
	return rec
}

// live starts a user request for "dev", has agent-1 take it, and returns its
// id and a function that ends the request and waits for the user side.
func (e *fuzzEnv) live(t *testing.T) (string, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://dev/", nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := e.broker.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}()
	end := func() {
		cancel()
		<-done
	}
	// The poll waits for the user's request and hands it over.
	rec := e.serve(http.MethodGet, "/server/request?server=dev", "agent-1", nil)
	msg, err := wire.UnmarshalRequest(rec.Body.Bytes(), 1<<20)
	if rec.Code != http.StatusOK || err != nil {
		end()
		t.Fatalf("poll: %d %q (%v)", rec.Code, rec.Body, err)
	}
	return msg.ID, end
}

// wantStatus is what the response endpoint must answer to body posted with
// token, where liveID is the one request in flight.
func wantStatus(body []byte, token, liveID string) int {
	if len(body) > maxChunk {
		return http.StatusRequestEntityTooLarge
	}
	msg, err := wire.UnmarshalResponse(body, maxChunk)
	if err != nil {
		return http.StatusBadRequest
	}
	i := strings.LastIndexByte(msg.ID, ':')
	if i <= 0 || i == len(msg.ID)-1 {
		return http.StatusBadRequest
	}
	if _, err := authorize(&http.Request{Header: http.Header{"Authorization": {"Bearer " + token}}}, msg.ID[:i]); err != nil {
		var ae *authError
		errors.As(err, &ae)
		return ae.status
	}
	if msg.ID != liveID {
		return http.StatusBadRequest
	}
	if token != "agent-1" {
		return http.StatusForbidden // another agent credential took the request
	}
	return http.StatusOK
}

// FuzzResponseEndpoint posts arbitrary bytes, delivered in arbitrary pieces,
// to POST /server/response while one request is in flight. The handler must
// never panic nor answer 500, and must answer exactly what the protocol
// says: 413 beyond the chunk limit, 400 for what does not decode or names no
// request in flight, 401/403 for refused credentials, 200 when delivered.
// When withID is set, the live request's id is appended as a last id field,
// which protobuf's last-one-wins rule makes the message's id when the bytes
// before it decode.
func FuzzResponseEndpoint(f *testing.F) {
	e := newFuzzEnv(f)
	seeds := [][]byte{
		nil,
		[]byte("garbage"),
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		{0x22, 0x01},       // id field, truncated
		{0x08, 0xc8, 0x01}, // status 200 alone
		(&wire.Response{HasStatus: true, StatusCode: 200, Header: []wire.Header{{Name: "Content-Type", Value: "text/plain"}}, Body: []byte("hello"), EOF: true}).Marshal(),
		(&wire.Response{HasStatus: true, StatusCode: 101, Header: []wire.Header{{Name: "Upgrade", Value: "websocket"}}}).Marshal(),
		(&wire.Response{Body: []byte("chunk"), Trailer: []wire.Header{{Name: "X-Sum", Value: "1"}}, EOF: true, BackendDurationMS: 12}).Marshal(),
		(&wire.Response{ID: "dev:" + strings.Repeat("0", 32), HasStatus: true, StatusCode: 200}).Marshal(),
		(&wire.Response{ID: "xdev:" + strings.Repeat("0", 32), HasStatus: true, StatusCode: 200}).Marshal(),
		(&wire.Response{ID: ":", HasStatus: true, StatusCode: 42}).Marshal(),
		(&wire.Response{HasStatus: true, StatusCode: -1, Trailer: []wire.Header{{Name: wire.AbortTrailer, Value: "x"}}}).Marshal(),
		(&wire.Response{Body: make([]byte, maxChunk)}).Marshal(),
	}
	for _, s := range seeds {
		for _, withID := range []bool{false, true} {
			f.Add(s, withID, uint8(0), []byte{})
			f.Add(s, withID, uint8(1), []byte{1, 3, 7})
		}
	}
	f.Add([]byte("x"), true, uint8(2), []byte{})

	tokens := []string{"agent-1", "agent-2", ""}
	f.Fuzz(func(t *testing.T, data []byte, withID bool, who uint8, splits []byte) {
		id, end := e.live(t)
		defer end()
		body := data
		if withID {
			body = protowire.AppendTag(bytes.Clone(data), 4, protowire.BytesType)
			body = protowire.AppendString(body, id)
		}
		token := tokens[int(who)%len(tokens)]
		want := wantStatus(body, token, id)
		rec := e.serve(http.MethodPost, "/server/response", token, &splitReader{b: body, splits: splits})
		if rec.Code != want {
			t.Fatalf("posting %q as %q answered %d %q, want %d", body, token, rec.Code, rec.Body, want)
		}
		if want != http.StatusOK {
			if strings.TrimSpace(rec.Body.String()) == "" || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
				t.Fatalf("a %d came with %q (%s), not a readable message", rec.Code, rec.Body, rec.Header().Get("Content-Type"))
			}
		}
	})
}
