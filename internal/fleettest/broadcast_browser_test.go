package fleettest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
)

// TestBroadcastMJPEGInBrowser opens a camera's page in two tabs of a
// headless Chromium, each through an access code: both show the MJPEG
// stream, which the device serves once. The screenshot of each tab is
// kept in the test's artifacts (go test -artifacts).
func TestBroadcastMJPEGInBrowser(t *testing.T) {
	browser := findBrowser(t)
	r := StartRelay(t)
	cam := newCamera()
	backend := httptestServer(t, cam)
	StartAgent(t, r, "cam", backend, r.Token(t, auth.KindAgent, "cam agent", "cam"), func(c *agent.Config) {
		c.BroadcastPaths = []string{"/stream.mjpeg"}
	})
	r.WaitDevice(t, "cam")
	_, tok, err := r.Node.Tokens().Create(t.Context(), auth.CreateRequest{Kind: auth.KindUser, Name: "viewer", Devices: []string{"cam"}})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := r.Node.Tokens().Principal(tok.ID)

	// The camera sends a frame every 50 ms while the test runs.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				cam.Next()
			case <-done:
				return
			}
		}
	})
	defer wg.Wait()
	defer close(done)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, stop := startBrowser(t, ctx, browser)
	defer stop()
	second, closeSecond := chromedp.NewContext(first)
	defer closeSecond()
	for i, tab := range []context.Context{first, second} {
		code, _, err := r.Node.IssueCode(p, "cam", "/", 0)
		if err != nil {
			t.Fatal(err)
		}
		err = chromedp.Do(tab,
			chromedp.Navigate(r.URL+"/client/cam/?code="+code),
			chromedp.Poll[chromedp.Void](`document.getElementById("cam").naturalWidth === 64`, chromedp.WithPollingTimeout(20*time.Second)),
		)
		if err != nil {
			t.Fatalf("tab %d: the stream is not shown: %v", i+1, err)
		}
	}
	for i, tab := range []context.Context{first, second} {
		png, err := chromedp.Run(tab, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot of tab %d: %v", i+1, err)
		}
		if err := os.WriteFile(filepath.Join(t.ArtifactDir(), fmt.Sprintf("mjpeg-tab%d.png", i+1)), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n := cam.gets.Load(); n != 1 {
		t.Fatalf("the device served %d GETs of the stream for two tabs; want 1", n)
	}
	if s, _ := topicOf(r, "cam", "GET /stream.mjpeg"); s.Readers != 2 {
		t.Fatalf("the relay shares the stream with %d viewers; want 2 (%+v)", s.Readers, s)
	}
}
