package fleettest

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
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

	holder.Node.Fleet().Abandon()
	holder.Node.Close()

	if rest, err := io.ReadAll(first); err == nil {
		t.Errorf("the stream begun through the dead holder ended cleanly (%q); want it broken off", rest)
	}
	g, p := <-get, <-post
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
}
