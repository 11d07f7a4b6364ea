package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/h1"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// rawService serves answer on every connection of a loopback port, and
// counts the connections: each is one stream the relay opened.
type rawService struct {
	addr  string
	conns atomic.Int32
}

// serveRaw starts a rawService whose handle serves one connection.
func serveRaw(t *testing.T, handle func(n int32, c net.Conn, br *bufio.Reader)) *rawService {
	t.Helper()
	s := &rawService{}
	s.addr = testkit.ServeTCP(t, func(c net.Conn) {
		n := s.conns.Add(1)
		handle(n, c, bufio.NewReader(c))
	})
	return s
}

// v2Raw is a version 2 session to svc's port.
func v2Raw(t *testing.T, svc *rawService) *Pool {
	t.Helper()
	return v2Session(t, svc.addr, service.Service{Name: service.Default, Kind: service.HTTP, Addr: svc.addr})
}

// h1Of returns the HTTP/1.1 client of the device's one session.
func h1Of(t *testing.T, pool *Pool) *h1.Client {
	t.Helper()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	l := pool.devices["dev"]
	if len(l) != 1 {
		t.Fatalf("%d sessions, want 1", len(l))
	}
	return &l[0].c.(*muxCarrier).h1
}

// getBody sends a GET of path through pool and returns its answer's body.
func getBody(t *testing.T, pool *Pool, path string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://dev"+path, nil)
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// keepAlive answers every request on a connection with body and the
// extra header lines, until the connection ends.
func keepAlive(body, extra string) func(int32, net.Conn, *bufio.Reader) {
	return func(n int32, c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s", len(body), extra, body)
		}
	}
}

// TestH1KeepAlive: sequential requests share one stream, which waits in
// the pool between them.
func TestH1KeepAlive(t *testing.T) {
	svc := serveRaw(t, keepAlive("hi", ""))
	pool := v2Raw(t, svc)
	for range 5 {
		if got := getBody(t, pool, "/"); got != "hi" {
			t.Fatalf("body %q", got)
		}
	}
	if n := svc.conns.Load(); n != 1 {
		t.Fatalf("%d connections to the service for 5 requests, want 1", n)
	}
	if n := h1Of(t, pool).NumIdle(); n != 1 {
		t.Fatalf("%d idle streams, want 1", n)
	}
}

// TestH1ConnectionCloseNotReused: an answer with Connection: close ends
// its stream, even when the service keeps its connection open.
func TestH1ConnectionCloseNotReused(t *testing.T) {
	svc := serveRaw(t, keepAlive("hi", "Connection: close\r\n"))
	pool := v2Raw(t, svc)
	getBody(t, pool, "/")
	getBody(t, pool, "/")
	if n := svc.conns.Load(); n != 2 {
		t.Fatalf("%d connections to the service, want 2", n)
	}
	if n := h1Of(t, pool).NumIdle(); n != 0 {
		t.Fatalf("%d idle streams, want 0", n)
	}
}

// TestH1UnreadBodyNotReused: an answer closed before its end resets its
// stream, and the agent closes that connection to the service.
func TestH1UnreadBodyNotReused(t *testing.T) {
	closed := make(chan int32, 2)
	big := strings.Repeat("x", 1<<20)
	svc := serveRaw(t, func(n int32, c net.Conn, br *bufio.Reader) {
		keepAlive(big, "")(n, c, br)
		closed <- n
	})
	pool := v2Raw(t, svc)
	req, _ := http.NewRequest(http.MethodGet, "http://dev/", nil)
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := getBody(t, pool, "/"); got != big {
		t.Fatalf("second answer of %d bytes", len(got))
	}
	if n := svc.conns.Load(); n != 2 {
		t.Fatalf("%d connections to the service, want 2", n)
	}
	select {
	case n := <-closed:
		if n != 1 {
			t.Fatalf("connection %d closed, want the first", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the connection of the abandoned answer stayed open")
	}
}

// TestH1CancelMidResponse: the request's context ending while its answer
// streams resets the stream: the read fails with the context's error and
// the agent closes its connection to the service.
func TestH1CancelMidResponse(t *testing.T) {
	gone := make(chan struct{})
	svc := serveRaw(t, func(_ int32, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst")
		io.Copy(io.Discard, br) // until the agent closes the connection
		close(gone)
	})
	pool := v2Raw(t, svc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://dev/", nil)
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, b); err != nil || string(b) != "first" {
		t.Fatalf("read %q, %v", b, err)
	}
	cancel()
	if _, err := resp.Body.Read(b); !errors.Is(err, context.Canceled) {
		t.Fatalf("read after cancel: %v, want context.Canceled", err)
	}
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the agent kept its connection to the service after the cancel")
	}
}

// expectService answers a request with Expect: 100-continue with a 100
// and then its body echoed when the path is /continue, else at once with
// 401 and without reading the body. before says whether the body had
// been read by the client when the service was about to send its 100.
func expectService(t *testing.T, bodyRead *atomic.Bool, before chan<- bool) *rawService {
	return serveRaw(t, func(_ int32, c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.URL.Path != "/continue" {
				io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
				continue
			}
			before <- bodyRead.Load()
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
			b, _ := io.ReadAll(req.Body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
		}
	})
}

// flagReader records that it was read.
type flagReader struct {
	io.Reader
	read *atomic.Bool
}

func (r flagReader) Read(p []byte) (int, error) {
	r.read.Store(true)
	return r.Reader.Read(p)
}

// TestH1ExpectContinue: a body with Expect: 100-continue goes only after
// the service's 100, which the request's trace sees; a service that
// answers first never gets the body, and that stream is not reused.
func TestH1ExpectContinue(t *testing.T) {
	var bodyRead atomic.Bool
	before := make(chan bool, 1)
	svc := expectService(t, &bodyRead, before)
	pool := v2Raw(t, svc)

	var got1xx []int
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
		got1xx = append(got1xx, code)
		return nil
	}}
	ctx := httptrace.WithClientTrace(context.Background(), trace)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://dev/continue", io.NopCloser(flagReader{strings.NewReader("payload"), &bodyRead}))
	req.ContentLength = 7
	req.Header.Set("Expect", "100-continue")
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "payload" || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %q", resp.Status, b)
	}
	if <-before {
		t.Fatal("the body went before the service's 100 Continue")
	}
	if len(got1xx) != 1 || got1xx[0] != http.StatusContinue {
		t.Fatalf("trace saw %v, want [100]", got1xx)
	}

	bodyRead.Store(false)
	req, _ = http.NewRequest(http.MethodPut, "http://dev/refuse", io.NopCloser(flagReader{strings.NewReader("payload"), &bodyRead}))
	req.ContentLength = 7
	req.Header.Set("Expect", "100-continue")
	resp, err = pool.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %s", resp.Status)
	}
	if bodyRead.Load() {
		t.Fatal("the body was read though the service answered without asking for it")
	}
	if n := h1Of(t, pool).NumIdle(); n != 0 {
		t.Fatalf("%d idle streams after an answer without the body, want 0", n)
	}
}

// TestH1UpgradeBufferedBytes: what the service sends right after its 101,
// in the same packet, reaches the user first, through Read and through
// WriteTo, and the body copies both ways with half-close.
func TestH1UpgradeBufferedBytes(t *testing.T) {
	svc := serveRaw(t, func(_ int32, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nhello ")
		got, _ := io.ReadAll(br)
		io.WriteString(c, "world: "+string(got))
	})
	pool := v2Raw(t, svc)
	for _, how := range []string{"Read", "WriteTo"} {
		req, _ := http.NewRequest(http.MethodGet, "http://dev/ws", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		resp, err := pool.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("status %s", resp.Status)
		}
		if _, ok := resp.Body.(io.WriterTo); !ok {
			t.Fatal("the upgraded body is no io.WriterTo")
		}
		rf, ok := resp.Body.(io.ReaderFrom)
		if !ok {
			t.Fatal("the upgraded body is no io.ReaderFrom")
		}
		if _, err := rf.ReadFrom(strings.NewReader(how)); err != nil {
			t.Fatal(err)
		}
		resp.Body.(interface{ CloseWrite() error }).CloseWrite()
		var got bytes.Buffer
		if how == "Read" {
			_, err = io.Copy(&got, onlyReader{resp.Body})
		} else {
			_, err = resp.Body.(io.WriterTo).WriteTo(&got)
		}
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if want := "hello world: " + how; got.String() != want {
			t.Fatalf("%s: read %q, want %q", how, got.String(), want)
		}
	}
}

// TestH1FullDuplex: a streamed upload and its streamed answer move at
// once (the service echoes each piece before the next is sent), and the
// stream is reused afterwards.
func TestH1FullDuplex(t *testing.T) {
	var conns atomic.Int32
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	backend.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	backend.Start()
	defer backend.Close()
	addr := strings.TrimPrefix(backend.URL, "http://")
	pool := v2Session(t, addr, service.Service{Name: service.Default, Kind: service.HTTP, Addr: addr})

	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, "http://dev/echo", pr)
	resp, err := pool.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	for i := range 3 {
		piece := fmt.Sprintf("piece %d;", i)
		if _, err := io.WriteString(pw, piece); err != nil {
			t.Fatal(err)
		}
		n, err := io.ReadFull(resp.Body, buf[:len(piece)])
		if err != nil || string(buf[:n]) != piece {
			t.Fatalf("echo %q, %v; want %q", buf[:n], err, piece)
		}
	}
	pw.Close()
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after the upload: %q, %v", rest, err)
	}
	resp.Body.Close()
	if got := getBody(t, pool, "/echo"); got != "" {
		t.Fatalf("GET answered %q", got)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections to the service, want 1 (reused after the upload)", n)
	}
}

// TestH1StaleIdleStream: a pooled stream whose service closed its
// connection meanwhile is not used, or when it is, the request goes once
// more on a new stream.
func TestH1StaleIdleStream(t *testing.T) {
	svc := serveRaw(t, func(_ int32, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") // and close at once
	})
	pool := v2Raw(t, svc)
	for range 3 {
		if got := getBody(t, pool, "/"); got != "ok" {
			t.Fatalf("body %q", got)
		}
	}
}

// TestH1ResponseHeaderTooLarge: a service's endless header ends the
// request with an error, not the relay's memory.
func TestH1ResponseHeaderTooLarge(t *testing.T) {
	svc := serveRaw(t, func(_ int32, c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		line := "X-Filler: " + strings.Repeat("x", 4000) + "\r\n"
		for {
			if _, err := io.WriteString(c, line); err != nil {
				return
			}
		}
	})
	pool := v2Raw(t, svc)
	req, _ := http.NewRequest(http.MethodGet, "http://dev/", nil)
	if _, err := pool.RoundTrip(req); !errors.Is(err, h1.ErrResponseHeaderTooLarge) {
		t.Fatalf("got %v, want h1.ErrResponseHeaderTooLarge", err)
	}
}

// failingBody yields some bytes, then fails with err.
type failingBody struct {
	sent bool
	err  error
}

func (b *failingBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, "part of a body"), nil
	}
	return 0, b.err
}

func (b *failingBody) Close() error { return nil }

// TestH1BodyFailureIsTheCause: a request body that fails to read resets
// the stream, and the round trip fails with the body's own error (the
// relay answers a user whose upload broke off by it).
func TestH1BodyFailureIsTheCause(t *testing.T) {
	svc := serveRaw(t, func(_ int32, c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body) // until the reset; never answers
	})
	pool := v2Raw(t, svc)
	boom := errors.New("the user went away mid-upload")
	req, _ := http.NewRequest(http.MethodPost, "http://dev/upload", &failingBody{err: boom})
	req.ContentLength = 1000
	if _, err := pool.RoundTrip(req); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the body's error", err)
	}
}
