package topic

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// mjpegDevice serves /stream.mjpeg as multipart/x-mixed-replace, one
// frame each time frames delivers a number, marked as a broadcast; it
// counts the GETs it serves and those running.
type mjpegDevice struct {
	frames  chan int
	gets    atomic.Int32
	running atomic.Int32
}

func (d *mjpegDevice) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.gets.Add(1)
	d.running.Add(1)
	defer d.running.Add(-1)
	w.Header().Set("Content-Type", "multipart/x-mixed-replace; boundary=frame")
	w.Header().Set(BroadcastHeader, "1")
	w.Header().Set("Set-Cookie", "viewer=first")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for {
		select {
		case i := <-d.frames:
			body := strings.Repeat(fmt.Sprint(i%10), 1000+i)
			fmt.Fprintf(w, "--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n%s\r\n", len(body), body)
			w.(http.Flusher).Flush()
		case <-r.Context().Done():
			return
		}
	}
}

// toDevice is a transport that sends every request to one server,
// whatever device its URL's host names, as a relay's transport does.
type toDevice struct{ base *url.URL }

func (t toDevice) RoundTrip(r *http.Request) (*http.Response, error) {
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host = t.base.Scheme, t.base.Host
	return http.DefaultTransport.RoundTrip(out)
}

// readFrame reads one multipart part and returns its body.
func readFrame(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil || line != "--frame\r\n" {
		t.Fatalf("part starts with %q, %v; want the boundary", line, err)
	}
	n := 0
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if h == "\r\n" {
			break
		}
		fmt.Sscanf(h, "Content-Length: %d", &n)
	}
	body := make([]byte, n+2)
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatal(err)
	}
	return string(body[:n])
}

func TestFanoutFetchesOnceViewersJoinAtTheNextFrame(t *testing.T) {
	dev := &mjpegDevice{frames: make(chan int)}
	backend := httptest.NewServer(dev)
	defer backend.Close()
	base, _ := url.Parse(backend.URL)
	h := newTestHub(t, Config{})
	fan := &Fanout{Next: toDevice{base}, Hub: h}
	defer fan.Close()
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := r.Clone(r.Context())
		out.URL.Host = "cam"
		resp, err := fan.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		w.(http.Flusher).Flush()
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			w.Write(buf[:n])
			w.(http.Flusher).Flush()
			if err != nil {
				return
			}
		}
	}))
	defer relay.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func() (*http.Response, *bufio.Reader) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, relay.URL+"/stream.mjpeg", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get(BroadcastHeader) != "" {
			t.Error("the broadcast marker reached a user")
		}
		if c := resp.Header.Get("Set-Cookie"); c != "" {
			t.Errorf("a viewer of a shared stream got the cookie %q the device set for one of them", c)
		}
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "multipart/x-mixed-replace") {
			t.Errorf("content type %q", resp.Header.Get("Content-Type"))
		}
		return resp, bufio.NewReader(resp.Body)
	}
	first, br1 := open()
	testkit.Eventually(t, 5*time.Second, func() error {
		if dev.running.Load() != 1 {
			return fmt.Errorf("%d GETs running at the device", dev.running.Load())
		}
		return nil
	})
	dev.frames <- 1
	if got := readFrame(t, br1); got != strings.Repeat("1", 1001) {
		t.Fatalf("first viewer's frame: %d bytes", len(got))
	}
	second, br2 := open()
	testkit.Eventually(t, 5*time.Second, func() error {
		if s := h.Stats(); len(s) != 1 || s[0].Readers != 2 {
			return fmt.Errorf("stats %+v; want two viewers", s)
		}
		return nil
	})
	for i := 2; i < 6; i++ {
		dev.frames <- i
	}
	for _, br := range []*bufio.Reader{br1, br2} {
		for i := 2; i < 6; i++ {
			if got := readFrame(t, br); got != strings.Repeat(fmt.Sprint(i), 1000+i) {
				t.Fatalf("frame %d: %d bytes of %.1q", i, len(got), got)
			}
		}
	}
	if n := dev.gets.Load(); n != 1 {
		t.Fatalf("the device served %d GETs for two viewers; want 1", n)
	}
	first.Body.Close()
	second.Body.Close()
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := dev.running.Load(); n != 0 {
			return fmt.Errorf("the device still serves %d GETs after the viewers left", n)
		}
		return nil
	})
}

func TestFanoutPassesUnmarkedAnswersThrough(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "plain "+r.URL.Path) }))
	defer backend.Close()
	base, _ := url.Parse(backend.URL)
	fan := &Fanout{Next: toDevice{base}, Hub: newTestHub(t, Config{})}
	defer fan.Close()
	for range 2 {
		req := httptest.NewRequest(http.MethodGet, "http://cam/page", nil)
		req.RequestURI = ""
		resp, err := fan.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "plain /page" {
			t.Fatalf("got %q", b)
		}
	}
}

func TestSplittersFindWholeParts(t *testing.T) {
	for _, tc := range []struct {
		ct, in string
		want   int
	}{
		{"multipart/x-mixed-replace; boundary=b", "--b\r\nX: 1\r\n\r\nabc\r\n--b\r\n", 18},
		{"multipart/x-mixed-replace; boundary=b", "--b\r\nContent-Length: 3\r\n\r\nabc\r\n", 31},
		{"multipart/x-mixed-replace; boundary=b", "--b\r\nContent-Length: 3\r\n\r\nab", 0},
		{"multipart/x-mixed-replace; boundary=b", "--b\r\nX: 1\r\n\r\nabc", 0},
		{"text/event-stream", "data: a\n\ndata: b", 9},
		{"text/event-stream", "data: a\r\n\r\n", 11},
		{"text/event-stream", "data: a\n", 0},
		{"text/plain", "line 1\nline 2\npart", 14},
		{"application/octet-stream", "no newline", 0},
	} {
		if got := splitterFor(tc.ct)([]byte(tc.in)); got != tc.want {
			t.Errorf("%s %q: %d; want %d", tc.ct, tc.in, got, tc.want)
		}
	}
}

// FuzzSplitters feeds the splitters arbitrary streams: a part is never
// empty nor longer than what was given, and nothing panics.
func FuzzSplitters(f *testing.F) {
	f.Add("--b\r\nContent-Length: 3\r\n\r\nabc\r\n--b\r\nContent-Length: 99999999999\r\n\r\n")
	f.Add("data: a\n\ndata: b\r\n\r\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, in string) {
		for _, ct := range []string{"multipart/x-mixed-replace; boundary=b", "text/event-stream", "text/plain"} {
			split := splitterFor(ct)
			buf := []byte(in)
			for len(buf) > 0 {
				k := split(buf)
				if k < 0 || k > len(buf) {
					t.Fatalf("%s: part of %d bytes in %d", ct, k, len(buf))
				}
				if k == 0 {
					break
				}
				buf = buf[k:]
			}
		}
	})
}
