package fleettest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-relay/switchboard/internal/control"
)

// browserNames are the executables the browser test looks for, in order.
var browserNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// requireBrowserEnv, set to 1, turns a missing browser from a skip into a
// failure, so that CI cannot pass without running the browser test.
const requireBrowserEnv = "SWITCHBOARD_REQUIRE_BROWSER"

// findBrowser returns the path of a Chromium-based browser, or skips the test
// when there is none.
func findBrowser(t *testing.T) string {
	t.Helper()
	for _, name := range browserNames {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	msg := fmt.Sprintf("no browser found (looked for %v in PATH)", browserNames)
	if os.Getenv(requireBrowserEnv) == "1" {
		t.Fatalf("%s, and %s=1 requires one", msg, requireBrowserEnv)
	}
	t.Skipf("%s; install chromium, or set %s=1 to make this a failure", msg, requireBrowserEnv)
	return ""
}

// startBrowser starts the headless browser at path and returns a context for its tab.
// stop closes the browser and waits until its process has exited.
func startBrowser(t *testing.T, ctx context.Context, path string) (tab context.Context, stop func()) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox, // tests may run as root, where the sandbox cannot start
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	tab, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithErrorf(t.Logf))
	if err := chromedp.Do(tab); err != nil { // starts the browser
		cancelTab()
		cancelAlloc()
		t.Fatalf("start the browser: %v", err)
	}
	return tab, func() {
		if err := chromedp.Cancel(tab); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("closing the browser: %v", err)
		}
		cancelTab()
		cancelAlloc() // waits for the browser process
	}
}

// TestAdminPageInBrowser signs in to a real relay's admin page in a headless
// browser the size of a phone, in a fleet of two: drains and undrains the
// relay with the page's buttons, checking the fleet state each time, and
// sees the page refuse to drain the last relay left serving, saying how to
// force it.
func TestAdminPageInBrowser(t *testing.T) {
	browser := findBrowser(t)
	relays := StartFleet(t, 2)
	r, other := relays[0], relays[1]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tab, stop := startBrowser(t, ctx, browser)
	defer stop()

	relayID, otherID := r.Node.Fleet().Status().RelayID, other.Node.Fleet().Status().RelayID
	row := fmt.Sprintf(`tr[data-relay=%q]`, relayID)
	drain := chromedp.CSS(row + ` button[value="drain"]`)
	undrain := chromedp.CSS(row + ` button[value="undrain"]`)
	drainOther := chromedp.CSS(fmt.Sprintf(`tr[data-relay=%q] button[value="drain"]`, otherID))
	Eventually(t, 10*time.Second, func() error { // both relays are in this relay's copy of the fleet state
		for _, id := range []string{relayID, otherID} {
			if _, err := r.Node.Fleet().Relay(id); err != nil {
				return err
			}
		}
		return nil
	})

	err := chromedp.Do(tab,
		chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait),
		chromedp.Navigate(r.AdminURL+control.PathAdmin),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), r.AdminToken),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(row)),
	)
	if err != nil {
		t.Fatalf("sign in through the form: %v", err)
	}
	if cookies, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.cookie`)); err != nil || cookies != "" {
		t.Errorf("document.cookie = %q, %v; the sign-in cookie must be HttpOnly", cookies, err)
	}
	checkNoHorizontalOverflow(t, tab)

	if err := chromedp.Do(tab, chromedp.Click(drain), chromedp.WaitVisible(undrain)); err != nil {
		t.Fatalf("drain with the button: %v", err)
	}
	waitDraining(t, r, relayID, true)

	// The other relay is now the last one serving: the page refuses.
	alert := chromedp.CSS(`p.alert`)
	if err := chromedp.Do(tab, chromedp.Click(drainOther), chromedp.WaitVisible(alert)); err != nil {
		t.Fatalf("drain the last relay serving with the button: %v", err)
	}
	msg, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector("p.alert").textContent`))
	if err != nil || !strings.Contains(msg, "was not drained") || !strings.Contains(msg, "--force "+otherID) {
		t.Fatalf("the page says %q (%v) on draining the last relay serving; want a refusal naming --force", msg, err)
	}
	waitDraining(t, r, otherID, false)

	if err := chromedp.Do(tab, chromedp.Navigate(r.AdminURL+control.PathAdmin), chromedp.Click(undrain), chromedp.WaitVisible(drain)); err != nil {
		t.Fatalf("undrain with the button: %v", err)
	}
	waitDraining(t, r, relayID, false)
}

// checkNoHorizontalOverflow checks that the page fits the width of the
// screen and that the relays table scrolls inside its own box instead.
func checkNoHorizontalOverflow(t *testing.T, tab context.Context) {
	t.Helper()
	type widths struct {
		Viewport    int `json:"viewport"`
		Page        int `json:"page"`
		Table       int `json:"table"`
		TableScroll int `json:"tableScroll"`
	}
	w, err := chromedp.Run(tab, chromedp.Evaluate[widths](`(() => {
		const box = document.querySelector(".scroll");
		return {
			viewport: window.innerWidth,
			page: document.documentElement.scrollWidth,
			table: box.clientWidth,
			tableScroll: box.scrollWidth,
		};
	})()`))
	if err != nil {
		t.Fatalf("measure the page: %v", err)
	}
	if w.Viewport != 390 {
		t.Fatalf("the page is %d px wide, not the phone's 390: is the viewport meta tag missing?", w.Viewport)
	}
	if w.Page > w.Viewport {
		t.Errorf("the page is %d px wide on a %d px screen: it scrolls sideways", w.Page, w.Viewport)
	}
	if w.TableScroll <= w.Table {
		t.Errorf("the relays table (%d px of %d px) does not scroll in its box; is it squeezed?", w.TableScroll, w.Table)
	}
}

// waitDraining waits until the operator API reports relay id's drain flag as
// draining.
func waitDraining(t *testing.T, r *Relay, id string, draining bool) {
	t.Helper()
	c := &control.Client{BaseURL: r.AdminURL, Token: r.AdminToken, HTTPClient: NewClient(t, false)}
	Eventually(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		relays, err := c.ListRelays(ctx)
		if err != nil {
			return err
		}
		for _, rs := range relays {
			if rs.ID == id {
				if rs.Draining != draining {
					return fmt.Errorf("relay %s: draining is %t, want %t", id, rs.Draining, draining)
				}
				return nil
			}
		}
		return fmt.Errorf("relay %s is not listed", id)
	})
}
