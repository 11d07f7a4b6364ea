package fleettest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"
)

// echoReply is what the test backend's /echo answers.
type echoReply struct {
	Backend string
	Method  string
	Path    string
	RawPath string
	Query   string
	Host    string
	Body    string
	Header  http.Header
	Chunked bool
}

// testBackend is a real HTTP server with the endpoints the data-plane tests need.
type testBackend struct {
	*httptest.Server
	name  string
	hits  atomic.Int64
	sseGo chan struct{} // the SSE handler sends its next event after a receive
}

func newBackend(t *testing.T, name string) *testBackend {
	t.Helper()
	b := &testBackend{name: name, sseGo: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/echo/", b.echo)
	mux.HandleFunc("/sse", b.sse)
	mux.HandleFunc("/trailers", trailers)
	mux.HandleFunc("/ws", wsEcho)
	mux.HandleFunc("/raw-upgrade", rawUpgrade)
	mux.HandleFunc("/stream-forever", streamForever)
	mux.HandleFunc("/bytes/{n}", sendBytes)
	b.Server = httptest.NewServer(mux)
	t.Cleanup(b.Close)
	return b
}

func (b *testBackend) echo(w http.ResponseWriter, r *http.Request) {
	b.hits.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(echoReply{
		Backend: b.name, Method: r.Method, Path: r.URL.Path, RawPath: r.URL.RawPath, Query: r.URL.RawQuery,
		Host: r.Host, Body: string(body), Header: r.Header, Chunked: len(r.TransferEncoding) > 0,
	})
}

// sse sends three events, each only after the test let it go, so that the
// test proves every event reaches the user before the next one exists. The
// query's type, if set, replaces the event-stream Content-Type: a plain
// chunked stream (kubectl logs -f) must flow the same way.
func (b *testBackend) sse(w http.ResponseWriter, r *http.Request) {
	ct := "text/event-stream"
	if t := r.URL.Query().Get("type"); t != "" {
		ct = t
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for i := 1; i <= 3; i++ {
		select {
		case <-b.sseGo:
		case <-r.Context().Done():
			return
		}
		fmt.Fprintf(w, "data: event %d\n\n", i)
		w.(http.Flusher).Flush()
	}
}

func trailers(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Trailer", "X-Checksum")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, "body before trailers")
	w.(http.Flusher).Flush()
	w.Header().Set("X-Checksum", "abc123")
	w.Header().Set(http.TrailerPrefix+"X-Late", "undeclared")
}

func wsEcho(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	for {
		typ, msg, err := c.Read(r.Context())
		if err != nil {
			return
		}
		if err := c.Write(r.Context(), typ, msg); err != nil {
			return
		}
	}
}

// rawUpgrade switches to a line echo protocol the way kubectl exec's SPDY
// upgrade does: a 101, then raw bytes both ways on the connection.
func rawUpgrade(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") != "echo-lines" {
		http.Error(w, "want Upgrade: echo-lines", http.StatusBadRequest)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo-lines\r\n\r\n")
	brw.Flush()
	sc := bufio.NewScanner(brw)
	for sc.Scan() {
		fmt.Fprintf(conn, "echo: %s\n", sc.Text())
	}
}

// streamForever writes a line and flushes until the client goes away.
func streamForever(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	for i := 0; r.Context().Err() == nil; i++ {
		if _, err := fmt.Fprintf(w, "line %d\n", i); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		if i > 10 {
			<-r.Context().Done()
		}
	}
}

// sendBytes answers n bytes of a repeating pattern.
func sendBytes(w http.ResponseWriter, r *http.Request) {
	var n int
	fmt.Sscan(r.PathValue("n"), &n)
	w.Header().Set("Content-Length", fmt.Sprint(n))
	buf := make([]byte, 32<<10)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	for n > 0 {
		k := min(n, len(buf))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

// httptestServer serves h on a loopback port until the test ends and returns its URL.
func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}
