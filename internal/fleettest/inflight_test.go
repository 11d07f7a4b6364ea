package fleettest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// stallingBackend holds the first GET and every POST until their agent's
// connection dies (or the test ends), and answers a later GET at once; a
// request for /stream gets its first line, then is held too. It counts
// what reached it and announces each request it holds on arrived.
type stallingBackend struct {
	gets, posts, streams atomic.Int64
	arrived              chan string
	release              chan struct{}
}

func newStallingBackend(t *testing.T) (*stallingBackend, string) {
	b := &stallingBackend{arrived: make(chan string, 4), release: make(chan struct{})}
	url := httptestServer(t, b)
	t.Cleanup(func() { close(b.release) }) // runs before the server's Close
	return b, url
}

func (b *stallingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	switch {
	case r.URL.Path == "/stream":
		b.streams.Add(1)
		io.WriteString(w, "first line\n")
		w.(http.Flusher).Flush()
	case r.Method == http.MethodGet && b.gets.Add(1) > 1:
		io.WriteString(w, "the GET again")
		return
	case r.Method == http.MethodPost:
		b.posts.Add(1)
	}
	b.arrived <- r.Method
	select {
	case <-r.Context().Done():
	case <-b.release:
	}
}

// TestInFlightThroughDeadHolder kills the relay holding a device while a
// GET and a POST that another relay forwarded to it wait at the device's
// backend: the GET, which may be repeated, is sent once more to the
// device's new holder and answered; the POST, which may have reached the
// device, fails with a 502 and is never sent again. Nor is a GET whose
// answer had begun: its user sees the answer break off.
func TestInFlightThroughDeadHolder(t *testing.T) {
	relays := StartFleet(t, 3)
	holder, others := HolderFor(t, relays, "dev")
	b, url := newStallingBackend(t)
	StartAgent(t, holder, "dev", url, FleetToken(t, relays, auth.KindAgent, "", "dev"))
	waitHolder(t, relays, "dev", holder)
	user := FleetToken(t, relays, auth.KindUser, "u", "dev")
	entry := others[0]

	type answer struct {
		status int
		body   string
		err    error
	}
	send := func(method string, body io.Reader) <-chan answer {
		out := make(chan answer, 1)
		req, err := http.NewRequest(method, entry.URL+"/client/dev/stall", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+user)
		c := NewClient(t, false)
		go func() {
			resp, err := c.Do(req)
			if err != nil {
				out <- answer{err: err}
				return
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out <- answer{status: resp.StatusCode, body: string(got)}
		}()
		return out
	}
	get := send(http.MethodGet, nil)
	post := send(http.MethodPost, strings.NewReader("once only"))
	streamReq, err := http.NewRequest(http.MethodGet, entry.URL+"/client/dev/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	streamReq.Header.Set("Authorization", "Bearer "+user)
	stream, err := NewClient(t, false).Do(streamReq)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	first := bufio.NewReader(stream.Body)
	if line, err := first.ReadString('\n'); err != nil || line != "first line\n" {
		t.Fatalf("the stream's first line: %q, %v", line, err)
	}
	for range 3 {
		select {
		case <-b.arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("the requests did not reach the backend")
		}
	}

	killed := time.Now()
	holder.Node.Fleet().Abandon()
	holder.Node.Close()

	if rest, err := io.ReadAll(first); err == nil {
		t.Errorf("the stream begun through the dead holder ended cleanly (%q); want it broken off", rest)
	}
	g, p := <-get, <-post
	t.Logf("the GET answered and the POST failed within %s of the kill", time.Since(killed).Round(time.Millisecond))
	if g.err != nil || g.status != http.StatusOK || g.body != "the GET again" {
		t.Errorf("GET in flight at the dead holder: %d %q, %v; want 200 from the device's new holder", g.status, g.body, g.err)
	}
	if p.err != nil || p.status != http.StatusBadGateway {
		t.Errorf("POST in flight at the dead holder: %d %q, %v; want a 502", p.status, p.body, p.err)
	}
	if n := b.posts.Load(); n != 1 {
		t.Errorf("the backend saw the POST %d times, want once", n)
	}
	if n := b.streams.Load(); n != 1 {
		t.Errorf("the backend saw the stream's GET %d times, want once: its user had the first line", n)
	}
	if n := b.gets.Load(); n != 2 {
		t.Errorf("the backend saw the GET %d times, want twice (once through each holder)", n)
	}
	if !entry.Node.Vetoed(holder.Node.Fleet().ID()) {
		t.Error("the relay that lost its forwards did not veto the dead holder")
	}
	if streams, _ := entry.Node.StreamForwards(); streams < 3 {
		t.Errorf("%d stream forwards, want the three requests' (the device's agent speaks version 2)", streams)
	}
}

// TestInFlightOnDyingTunnel gives a device two agents on one relay, one of
// which dies under the first request it takes: a GET it took is sent once
// more, to the other agent, and answered; a POST it took fails with a 502
// and never reaches the other agent.
func TestInFlightOnDyingTunnel(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		t.Run(method, func(t *testing.T) {
			r := StartRelay(t)
			b := newBackend(t, "b1")
			tok := r.Token(t, auth.KindAgent, "", "dev")
			StartAgent(t, r, "dev", b.URL, tok)
			r.WaitDevice(t, "dev")

			ctx, cancel := context.WithCancel(context.Background())
			conn, err := tunnel.Dial(ctx, tunnel.DialConfig{Relay: mustParse(t, r.URL), Device: "dev", Token: tok}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var died atomic.Bool
			served := make(chan struct{})
			go func() {
				defer close(served)
				tunnel.Serve(ctx, conn, http.HandlerFunc(func(_ http.ResponseWriter, req *http.Request) {
					died.Store(true)
					conn.Close() // the agent dies with the request in flight
					<-req.Context().Done()
				}), testLiveness)
			}()
			defer func() { cancel(); <-served }()
			Eventually(t, 5*time.Second, func() error {
				if n := r.Node.TunnelSessions(); n != 2 {
					return fmt.Errorf("%d tunnels, want 2", n)
				}
				return nil
			})

			user := r.Token(t, auth.KindUser, "u")
			c := NewClient(t, true)
			answered := int64(0)
			for i := 0; !died.Load(); i++ {
				if i == 50 {
					t.Fatal("no request reached the dying agent")
				}
				var payload io.Reader
				if method == http.MethodPost {
					payload = strings.NewReader("payload") // a GET with a body the relay cannot send again would not be replayed
				}
				req, err := http.NewRequest(method, r.URL+"/client/dev/echo/x", payload)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+user)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == http.StatusOK:
					answered++
				case method == http.MethodPost && died.Load() && resp.StatusCode == http.StatusBadGateway:
				default:
					t.Fatalf("%s %d (an agent died: %v): %d %s", method, i, died.Load(), resp.StatusCode, body)
				}
			}
			if method == http.MethodPost && answered != b.hits.Load() {
				t.Errorf("%d POSTs answered, the backend saw %d: the lost one was sent again", answered, b.hits.Load())
			}
			if method == http.MethodGet && answered != b.hits.Load() {
				t.Errorf("%d GETs answered, the backend saw %d", answered, b.hits.Load())
			}
		})
	}
}
