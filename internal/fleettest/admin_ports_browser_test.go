package fleettest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/control"
)

// TestAdminPagePortsInBrowser: the admin page, in a headless browser,
// lists the fleet's port mappings with the connections open through each
// on that relay, and the events of the ports and their connections, the
// user's address among them.
func TestAdminPagePortsInBrowser(t *testing.T) {
	browser := findBrowser(t)
	relays, hosts := portFleet(t)
	holder, _ := HolderFor(t, relays, "robot")
	host := hosts[0]
	if holder != relays[0] {
		host = hosts[1]
	}
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "echo=tcp://"+echoService(t)))
	holder.WaitDevice(t, "robot")
	port := strconv.Itoa(freePort(t))
	mustCtl(t, holder, "ports", "add", port, "robot/echo", "--max-connections", "8")
	addr := net.JoinHostPort(host, port)
	Eventually(t, 10*time.Second, func() error { _, err := echoPort(addr, "up"); return err })
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := newLineConn(conn).echo("held open"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tab, stop := startBrowser(t, ctx, browser)
	defer stop()
	row := fmt.Sprintf(`tr[data-port="tcp-%s"]`, port)
	err = chromedp.Do(tab,
		chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait),
		chromedp.Navigate(holder.AdminURL+control.PathAdmin),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), holder.AdminToken),
		chromedp.Click(chromedp.CSS(`form.signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(row)),
	)
	if err != nil {
		t.Fatalf("sign in and find the port's row: %v", err)
	}
	checkNoHorizontalOverflow(t, tab)
	type view struct {
		Row    string `json:"row"`
		Open   string `json:"open"`
		Events string `json:"events"`
	}
	Eventually(t, 10*time.Second, func() error {
		if err := chromedp.Do(tab, chromedp.Navigate(holder.AdminURL+control.PathAdmin), chromedp.WaitVisible(chromedp.CSS(row))); err != nil {
			return err
		}
		v, err := chromedp.Run(tab, chromedp.Evaluate[view](`(() => ({
			row: document.querySelector(`+strconv.Quote(row)+`).textContent,
			open: document.querySelector(`+strconv.Quote(row+" td.open")+`).textContent,
			events: [...document.querySelectorAll('table.port-events tr[data-type="tcp.connected"]')].map(r => r.textContent).join("\n"),
		}))()`))
		switch {
		case err != nil:
			return err
		case !strings.Contains(v.Row, "robot/echo") || !strings.Contains(v.Row, "8"):
			return fmt.Errorf("the port's row says %q", v.Row)
		case strings.TrimSpace(v.Open) != "1":
			return fmt.Errorf("the port's row counts %q connections open here, want 1", v.Open)
		case !strings.Contains(v.Events, "robot") || !strings.Contains(v.Events, conn.LocalAddr().String()):
			return fmt.Errorf("no tcp.connected event naming %s among the port events: %q", conn.LocalAddr(), v.Events)
		}
		return nil
	})
}
