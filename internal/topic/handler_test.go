package topic

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// serveHub serves h's topics on a real listener; a request is let in as
// the mode its "X-Test-Allow" header names ("" allows every mode).
func serveHub(t *testing.T, h *Hub) string {
	t.Helper()
	srv := httptest.NewServer(&Handler{Hub: h, Authorize: func(r *http.Request, _ Key, mode Mode) (*http.Request, Access, error) {
		if a := r.Header.Get("X-Test-Allow"); a != "" && a != mode.String() {
			return nil, Access{}, &RequestError{http.StatusForbidden, "not allowed " + mode.String()}
		}
		return r, Access{}, nil
	}})
	t.Cleanup(srv.Close)
	t.Cleanup(h.Close) // before the server: it ends the connections
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

func dial(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.SetReadLimit(2 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// waitReaders waits until the topic has n readers.
func waitReaders(t *testing.T, h *Hub, n int) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		got := 0
		for _, s := range h.Stats() {
			got += s.Readers
		}
		if got != n {
			return fmt.Errorf("%d readers; want %d", got, n)
		}
		return nil
	})
}

func TestMessagesArriveWholeAndInOrder(t *testing.T) {
	h := newTestHub(t, Config{})
	base := serveHub(t, h)
	readers := []*websocket.Conn{dial(t, base+"/topic/cam/video"), dial(t, base+"/topic/cam/video"), dial(t, base+"/topic/cam/video?mode=read")}
	waitReaders(t, h, len(readers))
	w := dial(t, base+"/topic/cam/video?mode=write")
	sizes := []int{1, 1 << 20, 7, 32 << 10, 1, 300 << 10, 1 << 20, 2, 65535, 65536, 125, 126}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, n := range sizes {
		typ := websocket.MessageBinary
		if i%3 == 0 {
			typ = websocket.MessageText
		}
		if err := w.Write(ctx, typ, bytes.Repeat([]byte{byte('a' + i)}, n)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for k, r := range readers {
		for i, n := range sizes {
			typ, data, err := r.Read(ctx)
			if err != nil {
				t.Fatalf("reader %d, message %d: %v", k, i, err)
			}
			wantTyp := websocket.MessageBinary
			if i%3 == 0 {
				wantTyp = websocket.MessageText
			}
			if typ != wantTyp || len(data) != n || !bytes.Equal(data, bytes.Repeat([]byte{byte('a' + i)}, n)) {
				t.Fatalf("reader %d, message %d: %v of %d bytes; want %v of %d bytes of %q", k, i, typ, len(data), wantTyp, n, rune('a'+i))
			}
		}
	}
}

func TestThrottledReaderDropsOthersGetEverything(t *testing.T) {
	h := newTestHub(t, Config{QueueMessages: 4, MaxLag: -1})
	base := serveHub(t, h)
	stuck := dial(t, base+"/topic/cam/video") // never reads
	fast := []*websocket.Conn{dial(t, base+"/topic/cam/video"), dial(t, base+"/topic/cam/video")}
	waitReaders(t, h, 3)
	w := dial(t, base+"/topic/cam/video?mode=write")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const count, size = 300, 64 << 10
	for i := range count {
		payload := bytes.Repeat([]byte{byte(i)}, size)
		if err := w.Write(ctx, websocket.MessageBinary, payload); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		// The readers that keep up take each message before the next.
		for k, r := range fast {
			_, data, err := r.Read(ctx)
			if err != nil || !bytes.Equal(data, payload) {
				t.Fatalf("reader %d, message %d: %d bytes, %v", k, i, len(data), err)
			}
		}
	}
	s := h.Stats()[0]
	if s.Dropped == 0 {
		t.Fatalf("the reader that never reads lost nothing: %+v", s)
	}
	if s.Delivered < 2*count {
		t.Fatalf("delivered %d; want at least %d", s.Delivered, 2*count)
	}
	stuck.CloseNow()
}

func TestLaggingReaderIsCut(t *testing.T) {
	h := newTestHub(t, Config{MaxLag: 200 * time.Millisecond})
	base := serveHub(t, h)
	stuck := dial(t, base+"/topic/cam/video")
	waitReaders(t, h, 1)
	w := dial(t, base+"/topic/cam/video?mode=write")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testkit.Eventually(t, 10*time.Second, func() error {
		if err := w.Write(ctx, websocket.MessageBinary, make([]byte, 256<<10)); err != nil {
			return err
		}
		if s := h.Stats(); len(s) == 0 || s[0].Cut != 1 || s[0].Readers != 0 {
			return fmt.Errorf("not cut yet: %+v", s)
		}
		return nil
	})
	stuck.CloseNow()
}

func TestReadOnlyConnectionMayNotWrite(t *testing.T) {
	h := newTestHub(t, Config{})
	base := serveHub(t, h)
	c := dial(t, base+"/topic/cam/video")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.Write(ctx, websocket.MessageText, []byte("hello"))
	_, _, err := c.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("read after a reader wrote: %v; want close 1008", err)
	}
}

func TestOversizedMessageEndsTheWriter(t *testing.T) {
	h := newTestHub(t, Config{MaxMessageBytes: 1000})
	base := serveHub(t, h)
	w := dial(t, base+"/topic/cam/video?mode=write")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.Write(ctx, websocket.MessageBinary, make([]byte, 1001))
	_, _, err := w.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("after an oversized message: %v; want close 1009", err)
	}
}

func TestBadRequestsAreRefusedClearly(t *testing.T) {
	h := newTestHub(t, Config{})
	base := serveHub(t, h)
	httpBase := "http" + strings.TrimPrefix(base, "ws")
	for _, tc := range []struct {
		path   string
		ws     bool
		header string
		status int
	}{
		{"/topic/cam", true, "", http.StatusNotFound},
		{"/topic/cam/a/b", true, "", http.StatusNotFound},
		{"/topic/c%20am/video", true, "", http.StatusBadRequest},
		{"/topic/cam/.hidden", true, "", http.StatusBadRequest},
		{"/topic/cam/" + strings.Repeat("x", 65), true, "", http.StatusBadRequest},
		{"/topic/cam/video?mode=all", true, "", http.StatusBadRequest},
		{"/topic/cam/video", false, "", http.StatusUpgradeRequired},
		{"/topic/cam/video?mode=write", true, "read", http.StatusForbidden},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var status int
		if tc.ws {
			c, resp, err := websocket.Dial(ctx, base+tc.path, &websocket.DialOptions{HTTPHeader: http.Header{"X-Test-Allow": {tc.header}}})
			if err == nil {
				c.CloseNow()
			}
			if resp != nil {
				status = resp.StatusCode
			}
		} else {
			resp, err := http.Get(httpBase + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			status = resp.StatusCode
		}
		cancel()
		if status != tc.status {
			t.Errorf("%s: status %d; want %d", tc.path, status, tc.status)
		}
	}
}
