package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const guardTimeout = 300 * time.Millisecond

// guardServer serves h under GuardIdle on a loopback port, HTTP/1.1 or h2c
// by prior knowledge, configured as the node configures its listeners, with
// a client for it; both stop when the test ends, and no goroutine may be
// left then.
func guardServer(t *testing.T, h2 bool, h http.Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := httptest.NewUnstartedServer(GuardIdle(h, guardTimeout))
	srv.Config.HTTP2 = &http.HTTP2Config{WriteByteTimeout: guardTimeout}
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	if h2 {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return srv, &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// protocols runs f over HTTP/1.1 and over HTTP/2.
func protocols(t *testing.T, f func(t *testing.T, h2 bool)) {
	t.Run("HTTP/1.1", func(t *testing.T) { f(t, false) })
	t.Run("HTTP/2", func(t *testing.T) { f(t, true) })
}

// echoSize reads the body and answers its size, or the read's error as
// the relay does.
var echoSize = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		writeError(w, err)
		return
	}
	fmt.Fprintf(w, "%d bytes\n", n)
})

// pacedBody writes a chunk every interval, count times, then ends.
func pacedBody(chunk string, interval time.Duration, count int) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for range count {
			<-tick.C
			if _, err := io.WriteString(pw, chunk); err != nil {
				return
			}
		}
		pw.Close()
	}()
	return pr
}

func TestGuardStalledBody(t *testing.T) {
	protocols(t, func(t *testing.T, h2 bool) {
		srv, client := guardServer(t, h2, echoSize)
		pr, pw := io.Pipe()
		defer pw.Close()
		go io.WriteString(pw, "the first bytes, then nothing")
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/upload", pr)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		took := time.Since(start)
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("got %d %q, want 408", resp.StatusCode, body)
		}
		want := "no byte of the request body arrived for 300ms; the relay stopped waiting for it\n"
		if string(body) != want {
			t.Errorf("body %q, want %q", body, want)
		}
		if took < guardTimeout || took > guardTimeout+5*time.Second {
			t.Errorf("answered after %v, want soon after %v", took, guardTimeout)
		}
		if !h2 && !resp.Close {
			t.Error("the HTTP/1.1 connection stays open with the rest of the body on it")
		}
	})
}

func TestGuardSteadyBodyPasses(t *testing.T) {
	protocols(t, func(t *testing.T, h2 bool) {
		srv, client := guardServer(t, h2, echoSize)
		// 4·timeout of body, a chunk every timeout/5.
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/upload", pacedBody("0123456789", guardTimeout/5, 20))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "200 bytes\n" {
			t.Fatalf("got %d %q, want 200 \"200 bytes\"", resp.StatusCode, body)
		}
	})
}

func TestGuardQuietHandlerNotCut(t *testing.T) {
	protocols(t, func(t *testing.T, h2 bool) {
		// A device that thinks for 3·timeout, then streams a line every
		// timeout/2 for 3·timeout more: nothing waits on the client.
		srv, client := guardServer(t, h2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(3 * guardTimeout):
			case <-r.Context().Done():
				return
			}
			tick := time.NewTicker(guardTimeout / 2)
			defer tick.Stop()
			for i := range 6 {
				fmt.Fprintf(w, "line %d\n", i)
				http.NewResponseController(w).Flush()
				<-tick.C
			}
		}))
		resp, err := client.Get(srv.URL + "/follow")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || strings.Count(string(body), "line") != 6 {
			t.Fatalf("got %q, %v; want 6 lines", body, err)
		}
	})
}

func TestGuardBidiStreamWithQuietClient(t *testing.T) {
	// HTTP/2 only: a body still open while the response streams, as in a
	// gRPC bidirectional call whose client has nothing to say. Once the
	// response has begun, the resting body is not cut, even when the
	// response rests too.
	srv, client := guardServer(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		read := make(chan error, 1)
		go func() { _, err := io.Copy(io.Discard, r.Body); read <- err }()
		tick := time.NewTicker(guardTimeout / 4)
		defer tick.Stop()
		for i := range 8 { // 2·timeout of a stream while the body read waits
			fmt.Fprintf(w, "message %d\n", i)
			rc.Flush()
			<-tick.C
		}
		select { // and 2·timeout of quiet both ways
		case err := <-read:
			fmt.Fprintf(w, "read ended: %v\n", err)
			return
		case <-time.After(2 * guardTimeout):
		}
		fmt.Fprintln(w, "still open")
	}))
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/chat", pr)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the stream broke: %v after %q", err, body)
	}
	if !strings.Contains(string(body), "message 7\n") || !strings.HasSuffix(string(body), "still open\n") {
		t.Fatalf("got %q, want 8 messages, then the stream still open", body)
	}
}

func TestGuardUnreadResponse(t *testing.T) {
	protocols(t, func(t *testing.T, h2 bool) {
		writeFailed := make(chan error, 1)
		srv, client := guardServer(t, h2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			chunk := []byte(strings.Repeat("x", 32<<10))
			for {
				if _, err := w.Write(chunk); err != nil {
					writeFailed <- err
					return
				}
			}
		}))
		if h2 {
			// The stream's window stops the server: the client reads
			// the connection but not the response.
			resp, err := client.Get(srv.URL + "/big")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
		} else {
			// The TCP buffers fill up: the client reads nothing.
			io.WriteString(dialSmall(t, srv), "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		}
		start := time.Now()
		select {
		case err := <-writeFailed:
			if took := time.Since(start); took < guardTimeout-50*time.Millisecond {
				t.Errorf("the write failed after %v, before the timeout", took)
			}
			t.Logf("the handler's write failed: %v", err)
		case <-time.After(guardTimeout + 10*time.Second):
			t.Fatal("the handler still writes to a client that reads nothing")
		}
	})
}

func TestGuardUnreadBodyOfARefusedRequest(t *testing.T) {
	// Without the guard net/http would wait forever for the rest of the
	// body before answering, to keep the connection.
	srv, _ := guardServer(t, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		textError(w, http.StatusUnauthorized, "a user token is required")
	}))
	conn := dialSmall(t, srv)
	io.WriteString(conn, "POST /client/dev/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nten bytes.")
	start := time.Now()
	conn.SetReadDeadline(start.Add(guardTimeout + 10*time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("status %d, want 401", resp.StatusCode)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Errorf("after the answer: %v, want the connection closed", err)
	}
	if took := time.Since(start); took > guardTimeout+5*time.Second {
		t.Errorf("took %v", took)
	}
}

func TestGuardSkipsUpgrades(t *testing.T) {
	for _, tt := range []struct {
		method, upgrade string
		guarded         bool
	}{
		{"GET", "websocket", false},
		{"CONNECT", "", false},
		{"POST", "h2c", true},
		{"POST", "", true},
	} {
		r := httptest.NewRequest(tt.method, "/x", strings.NewReader("body"))
		if tt.upgrade != "" {
			r.Header.Set("Upgrade", tt.upgrade)
		}
		w := httptest.NewRecorder()
		gw, gr, unguard := guardIdle(w, r, time.Minute)
		_, isGuarded := gw.(*idleWriter)
		if isGuarded != tt.guarded || (gr.Body != r.Body) != tt.guarded {
			t.Errorf("%s Upgrade %q: guarded %v, want %v", tt.method, tt.upgrade, isGuarded, tt.guarded)
		}
		unguard()
	}
	if _, _, unguard := guardIdle(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil), 0); unguard == nil {
		t.Error("no unguard func with the guard off")
	}
}

// dialSmall connects to srv with a small receive buffer, closed when the
// test ends.
func dialSmall(t *testing.T, srv *httptest.Server) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).SetReadBuffer(4096)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func mustRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestGuardHTTP2ClientReadingNothing(t *testing.T) {
	// A client that reads nothing at all stalls the whole HTTP/2
	// connection: the stream's reset would wait behind the data, so the
	// listener's WriteByteTimeout closes the connection.
	writeFailed := make(chan error, 1)
	srv, _ := guardServer(t, true, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := []byte(strings.Repeat("x", 32<<10))
		for {
			if _, err := w.Write(chunk); err != nil {
				writeFailed <- err
				return
			}
		}
	}))
	conn := dialSmall(t, srv)
	tr := &http.Transport{Protocols: new(http.Protocols), DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(mustRequest(t, srv.URL+"/big"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	select {
	case err := <-writeFailed:
		t.Logf("the handler's write failed: %v", err)
	case <-time.After(guardTimeout + 10*time.Second):
		t.Fatal("the handler still writes to a client that reads nothing")
	}
}
