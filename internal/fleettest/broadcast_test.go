package fleettest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// camera serves /stream.mjpeg: a multipart/x-mixed-replace stream of
// JPEG frames, one each time Next is called, to every GET running. It
// counts the GETs it served and those running.
type camera struct {
	gets, running atomic.Int32

	mu   sync.Mutex // guards seq and tick
	seq  int
	tick chan struct{} // closed when frame seq+1 is out
}

func newCamera() *camera { return &camera{tick: make(chan struct{})} }

// Next sends the next frame to every viewer the camera serves.
func (c *camera) Next() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	close(c.tick)
	c.tick = make(chan struct{})
}

func (c *camera) now() (int, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq, c.tick
}

// frame is JPEG number i: a square whose shade follows i.
func frame(i int) []byte {
	img := image.NewGray(image.Rect(0, 0, 64, 48))
	for p := range img.Pix {
		img.Pix[p] = uint8(i * 37)
	}
	img.Set(i%64, 0, color.White)
	var b bytes.Buffer
	jpeg.Encode(&b, img, nil)
	return b.Bytes()
}

func (c *camera) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/stream.mjpeg" {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, `<!doctype html><title>cam</title><img id="cam" src="stream.mjpeg">`)
		return
	}
	c.gets.Add(1)
	c.running.Add(1)
	defer c.running.Add(-1)
	w.Header().Set("Content-Type", "multipart/x-mixed-replace; boundary=frame")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	sent, tick := c.now()
	for {
		select {
		case <-tick:
		case <-r.Context().Done():
			return
		}
		var seq int
		seq, tick = c.now()
		for ; sent < seq; sent++ {
			img := frame(sent + 1)
			fmt.Fprintf(w, "--frame\r\nContent-Type: image/jpeg\r\nX-Seq: %d\r\nContent-Length: %d\r\n\r\n", sent+1, len(img))
			w.Write(img)
			io.WriteString(w, "\r\n")
		}
		w.(http.Flusher).Flush()
	}
}

// viewer is one user's GET of the stream.
type viewer struct {
	resp *http.Response
	br   *bufio.Reader
}

func openViewer(t *testing.T, ctx context.Context, r *Relay, tok string) *viewer {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/client/cam/stream.mjpeg", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := NewClient(t, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "multipart/x-mixed-replace") {
		t.Fatalf("GET the stream: %s, %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	if resp.Header.Get("X-Switchboard-Broadcast") != "" {
		t.Fatal("the broadcast marker reached a user")
	}
	return &viewer{resp: resp, br: bufio.NewReader(resp.Body)}
}

// frame reads the viewer's next whole part and returns its sequence.
func (v *viewer) frame(t *testing.T) int {
	t.Helper()
	line, err := v.br.ReadString('\n')
	for err == nil && line == "\r\n" { // a line break the previous part left
		line, err = v.br.ReadString('\n')
	}
	if err != nil || line != "--frame\r\n" {
		t.Fatalf("part starts with %q, %v", line, err)
	}
	seq, n := -1, -1
	for {
		h, err := v.br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if h == "\r\n" {
			break
		}
		name, value, _ := strings.Cut(strings.TrimSpace(h), ": ")
		switch name {
		case "X-Seq":
			seq, _ = strconv.Atoi(value)
		case "Content-Length":
			n, _ = strconv.Atoi(value)
		}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(v.br, body); err != nil || !bytes.Equal(body, frame(seq)) {
		t.Fatalf("frame %d: %d bytes, %v", seq, len(body), err)
	}
	return seq
}

// fanoutViewers is how many viewers share the stream on r: its users
// and, on the holder, the relays fed from it.
func fanoutViewers(r *Relay) int {
	s, _ := topicOf(r, "cam", "GET /stream.mjpeg")
	return s.Readers
}

// TestBroadcastPathFetchedOncePerFleet: an agent marks /stream.mjpeg a
// broadcast; two viewers on each of three relays make the device serve
// one GET, and each relay one copy from the holder. Every viewer gets
// whole frames in order from the one after it joined. A version 1 or
// long-poll agent marks the answers itself; for a version 2 agent, which
// does not parse HTTP, the relay marks them from its announcement.
func TestBroadcastPathFetchedOncePerFleet(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*agent.Config)
	}{
		{"native", func(*agent.Config) {}},
		{"native-v1", func(c *agent.Config) { c.TunnelVersion = tunnel.V1 }},
		{"longpoll", func(c *agent.Config) { c.Protocol = agent.ProtocolLongPoll }},
	} {
		t.Run(tc.name, func(t *testing.T) { testBroadcastPathFetchedOnce(t, tc.set) })
	}
}

func testBroadcastPathFetchedOnce(t *testing.T, set func(*agent.Config)) {
	relays := StartFleet(t, 3)
	holder, others := HolderFor(t, relays, "cam")
	cam := newCamera()
	backend := httptestServer(t, cam)
	StartAgent(t, holder, "cam", backend, holder.Token(t, auth.KindAgent, "cam agent", "cam"), func(c *agent.Config) {
		c.BroadcastPaths = []string{"/stream.mjpeg"}
		set(c)
	})
	holder.WaitDevice(t, "cam")
	tok := FleetToken(t, relays, auth.KindUser, "viewer", "cam")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var viewers []*viewer
	for _, r := range append([]*Relay{holder}, others...) {
		for range 2 {
			viewers = append(viewers, openViewer(t, ctx, r, tok))
		}
		Eventually(t, 10*time.Second, func() error {
			want := 2
			if r == holder {
				want = 2 + len(relays) - 1 // its users, then each relay as it comes
			}
			if got := fanoutViewers(r); r != holder && got != want {
				return fmt.Errorf("%d viewers share the stream on %s; want %d", got, r.Node.Fleet().ID(), want)
			}
			return nil
		})
	}
	Eventually(t, 10*time.Second, func() error {
		if got := fanoutViewers(holder); got != 2+len(others) {
			return fmt.Errorf("the holder shares its fetch with %d viewers; want 2 users and %d relays", got, len(others))
		}
		if n := cam.running.Load(); n != 1 {
			return fmt.Errorf("the device serves %d GETs", n)
		}
		return nil
	})
	for range 3 {
		cam.Next()
	}
	for i, v := range viewers {
		first := v.frame(t)
		for k := 1; k < 3; k++ {
			if got := v.frame(t); got != first+k {
				t.Fatalf("viewer %d: frame %d after %d", i, got, first+k-1)
			}
		}
	}
	if n := cam.gets.Load(); n != 1 {
		t.Fatalf("the device served %d GETs for %d viewers on %d relays; want 1", n, len(viewers), len(relays))
	}
	for _, v := range viewers {
		v.resp.Body.Close()
	}
	Eventually(t, 10*time.Second, func() error {
		if n := cam.running.Load(); n != 0 {
			return fmt.Errorf("the device still serves %d GETs after every viewer left", n)
		}
		return nil
	})
}

// TestBroadcastServerSentEventsJoinAtTheNextEvent: a second viewer of a
// shared event stream starts at the next whole event, and the device
// serves the stream once.
func TestBroadcastServerSentEventsJoinAtTheNextEvent(t *testing.T) {
	r := StartRelay(t)
	events := make(chan string)
	var gets atomic.Int32
	backend := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		gets.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case e := <-events:
				// An event in two writes: a viewer never sees half of one.
				io.WriteString(w, "id: "+e+"\ndata: "+e)
				w.(http.Flusher).Flush()
				io.WriteString(w, " done\n\n")
				w.(http.Flusher).Flush()
			case <-req.Context().Done():
				return
			}
		}
	}))
	StartAgent(t, r, "cam", backend, r.Token(t, auth.KindAgent, "cam agent", "cam"), func(c *agent.Config) {
		c.BroadcastPaths = []string{"/events"}
	})
	r.WaitDevice(t, "cam")
	tok := r.Token(t, auth.KindUser, "viewer", "cam")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func() *bufio.Reader {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/client/cam/events", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := NewClient(t, false).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return bufio.NewReader(resp.Body)
	}
	event := func(br *bufio.Reader) string {
		var lines []string
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if l == "\n" {
				return strings.Join(lines, "|")
			}
			lines = append(lines, strings.TrimSuffix(l, "\n"))
		}
	}
	first := open()
	Eventually(t, 10*time.Second, func() error {
		if fanoutViewersOf(r, "GET /events") != 1 {
			return errNotYet
		}
		return nil
	})
	events <- "1"
	if got := event(first); got != "id: 1|data: 1 done" {
		t.Fatalf("first viewer: %q", got)
	}
	second := open()
	Eventually(t, 10*time.Second, func() error {
		if fanoutViewersOf(r, "GET /events") != 2 {
			return errNotYet
		}
		return nil
	})
	events <- "2"
	for i, br := range []*bufio.Reader{first, second} {
		if got := event(br); got != "id: 2|data: 2 done" {
			t.Fatalf("viewer %d: %q", i+1, got)
		}
	}
	if n := gets.Load(); n != 1 {
		t.Fatalf("the device served %d GETs for two viewers; want 1", n)
	}
}

// fanoutViewersOf is how many viewers share the stream name on r.
func fanoutViewersOf(r *Relay, name string) int {
	s, _ := topicOf(r, "cam", name)
	return s.Readers
}
