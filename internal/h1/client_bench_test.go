package h1

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/mux"
)

// BenchmarkRoundTrip sends small GETs over one pooled stream to a service
// that answers each with a fixed small answer: the client's own cost per
// request, with -benchmem its allocations.
func BenchmarkRoundTrip(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		agent := mux.New(c, mux.Config{Client: true})
		defer agent.Close()
		st, err := agent.Accept()
		if err != nil {
			return
		}
		br := bufio.NewReader(st)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if _, err := io.WriteString(st, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"); err != nil {
				return
			}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	relay := mux.New(conn, mux.Config{RefuseStreams: true})
	c := &Client{Open: func(ctx context.Context) (*mux.Stream, error) { return relay.Open(ctx, nil) }}
	defer func() {
		c.CloseIdle(true)
		relay.Close()
		<-done
	}()
	req, _ := http.NewRequest(http.MethodGet, "http://service/x", nil)
	req.Header.Set("User-Agent", "bench")
	buf := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := resp.Body.Read(buf); err != nil {
				break
			}
		}
		resp.Body.Close()
	}
}
