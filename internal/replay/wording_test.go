package replay

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestLibraryWording pins the texts libraryFailure matches to what
// net/http and golang.org/x/net/http2 say today: each case makes the
// library fail so, over real sockets, and checks both the words and their
// reading. A library that rewords an error fails here, not in production.
func TestLibraryWording(t *testing.T) {
	t.Run("x/net: a new connection closed unused", func(t *testing.T) {
		cc := xnetConn(t, dialPeer(t, nil))
		cc.Close()
		_, err := cc.RoundTrip(get(t, "http://dev/"))
		expect(t, err, textNotEstablished, Unopened)
	})
	t.Run("x/net: a connection taking no new streams", func(t *testing.T) {
		cc := xnetConn(t, dialPeer(t, nil))
		cc.SetDoNotReuse()
		_, err := cc.RoundTrip(get(t, "http://dev/"))
		expect(t, err, textUnusable, Unopened)
	})
	t.Run("x/net: a graceful GOAWAY below the request's stream", func(t *testing.T) {
		cc := xnetConn(t, dialPeer(t, func(fr *http2.Framer, _ uint32, c net.Conn) {
			fr.WriteGoAway(0, http2.ErrCodeNo, nil)
			io.Copy(io.Discard, c)
		}))
		_, err := cc.RoundTrip(get(t, "http://dev/"))
		expect(t, err, textGotGoAway, Unopened)
	})
	t.Run("x/net: closed by this side with the request in flight", func(t *testing.T) {
		inFlight := make(chan struct{})
		cc := xnetConn(t, dialPeer(t, func(_ *http2.Framer, _ uint32, c net.Conn) {
			close(inFlight)
			io.Copy(io.Discard, c) // the peer holds on: only this side closes
		}))
		go func() { <-inFlight; cc.Close() }()
		_, err := cc.RoundTrip(get(t, "http://dev/"))
		expect(t, err, textForceClosed, Lost)
	})
	t.Run("x/net: pings unanswered", func(t *testing.T) {
		c := dialPeer(t, func(_ *http2.Framer, _ uint32, c net.Conn) {
			io.Copy(io.Discard, c)
		})
		tr := &http2.Transport{AllowHTTP: true, ReadIdleTimeout: 20 * time.Millisecond, PingTimeout: 20 * time.Millisecond}
		cc, err := tr.NewClientConn(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		_, err = cc.RoundTrip(get(t, "http://dev/"))
		expect(t, err, textConnLost, Lost)
	})
	t.Run("net/http: a GOAWAY and a close", func(t *testing.T) {
		addr := peer(t, func(fr *http2.Framer, id uint32, c net.Conn) {
			fr.WriteGoAway(id, http2.ErrCodeNo, nil)
			c.Close()
		})
		_, err := h2cTransport(t, nil).RoundTrip(get(t, "http://"+addr+"/"))
		expect(t, err, textGoAwayClosed, Lost)
	})
	t.Run("net/http: pings unanswered", func(t *testing.T) {
		addr := peer(t, func(_ *http2.Framer, _ uint32, c net.Conn) {
			io.Copy(io.Discard, c) // hears the pings, answers nothing
		})
		tr := h2cTransport(t, &http.HTTP2Config{SendPingTimeout: 20 * time.Millisecond, PingTimeout: 20 * time.Millisecond})
		_, err := tr.RoundTrip(get(t, "http://"+addr+"/"))
		expect(t, err, textConnLost, Lost)
	})
	t.Run("net/http: a stream reset by the peer", func(t *testing.T) {
		addr := peer(t, func(fr *http2.Framer, id uint32, c net.Conn) {
			fr.WriteRSTStream(id, http2.ErrCodeInternal)
			io.Copy(io.Discard, c)
		})
		_, err := h2cTransport(t, nil).RoundTrip(get(t, "http://"+addr+"/"))
		expect(t, err, "stream error: stream ID 1; INTERNAL_ERROR; received from peer", Reset)
	})
	t.Run("net/http, HTTP/1.1: closed without an answer", func(t *testing.T) {
		ln := listen(t)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			http.ReadRequest(bufio.NewReader(c))
			c.Close()
		}()
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		_, err := tr.RoundTrip(get(t, "http://"+ln.Addr().String()+"/"))
		expect(t, err, "EOF", Lost) // typed: io.EOF
	})
}

// expect checks that err says want, word for word at its start, and that
// Classify reads it as f.
func expect(t *testing.T, err error, want string, f Failure) {
	t.Helper()
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("the library said %v, want %q", err, want)
	}
	if got := Classify(err); got != f {
		t.Fatalf("%v: read as %v, want %v", err, got, f)
	}
}

func get(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// peer starts a bare HTTP/2 server for one connection: it reads the
// client's preface, sends its SETTINGS, waits for the first request's
// HEADERS and hands the framer, the stream and the connection to act.
// With act nil it only reads.
func peer(t *testing.T, act func(fr *http2.Framer, id uint32, c net.Conn)) string {
	t.Helper()
	ln := listen(t)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		context.AfterFunc(t.Context(), func() { c.Close() })
		if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(c, c)
		if fr.WriteSettings() != nil {
			return
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if h, ok := f.(*http2.HeadersFrame); ok {
				if act == nil {
					io.Copy(io.Discard, c)
					return
				}
				act(fr, h.StreamID, c)
				return
			}
		}
	}()
	return ln.Addr().String()
}

// dialPeer connects to a peer started with act.
func dialPeer(t *testing.T, act func(*http2.Framer, uint32, net.Conn)) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", peer(t, act))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// xnetConn starts x/net's HTTP/2 client on c, as the tunnel pool does.
func xnetConn(t *testing.T, c net.Conn) *http2.ClientConn {
	t.Helper()
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// h2cTransport is net/http's HTTP/2 with prior knowledge, as the router's
// peer transport for http:// relays.
func h2cTransport(t *testing.T, conf *http.HTTP2Config) *http.Transport {
	tr := &http.Transport{Protocols: new(http.Protocols), HTTP2: conf}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}
