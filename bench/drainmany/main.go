// Command drainmany drains a relay that holds many idle native agents and
// measures how long they take to move to another relay, and whether any
// request fails meanwhile. Two `switchboard serve` processes share one NATS
// server hosted by this process; the agents (real Switchboard agents, one
// per device) and their backend run in this process and all start on the
// first relay.
//
//	go run ./bench/drainmany -agents 10000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/store"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-agent-worker" {
		if err := agentWorker(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	n := flag.Int("agents", 10000, "idle native agents, one per device")
	workers := flag.Int("workers", 4, "processes the agents run in (each has its own open-file limit)")
	bin := flag.String("bin", "", "switchboard binary (default: build one)")
	spread := flag.Duration("spread", 5*time.Second, "the drained relay's --drain-spread")
	md := flag.String("md", "", "also write the result as Markdown to this file")
	flag.Parse()
	if err := run(*n, *workers, *bin, *spread, *md); err != nil {
		log.Fatal(err)
	}
}

func run(n, workers int, bin string, spread time.Duration, md string) error {
	dir, err := os.MkdirTemp("", "switchboard-drainmany-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin, err = benchkit.Binary(bin, dir); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.Open(ctx, store.Config{DataDir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer st.Close()
	type relay struct{ port, admin, dir string }
	var relays []relay
	var cmds []*exec.Cmd
	defer func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for i := range 2 {
		r := relay{port: benchkit.FreePort(), admin: benchkit.FreePort(), dir: filepath.Join(dir, fmt.Sprint("relay", i))}
		cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:"+r.port, "--admin-listen", "127.0.0.1:"+r.admin,
			"--data", r.dir, "--nats", st.ClientURL(), "--advertise", "http://127.0.0.1:"+r.port,
			"--allow-anonymous-users", "--allow-anonymous-agents", "--log-level", "error",
			"--max-forward", fmt.Sprint(2*n), "--drain-spread", spread.String())
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
		relays = append(relays, r)
		if err := waitReady("http://127.0.0.1:" + r.admin + "/readyz"); err != nil {
			return err
		}
	}
	// The second relay joins only after the agents are placed: all of them
	// start on the first (with the second out of the way, drained).
	token, _ := os.ReadFile(filepath.Join(relays[0].dir, "admin.token"))
	api := &control.Client{BaseURL: "http://127.0.0.1:" + relays[0].admin, Token: strings.TrimSpace(string(token))}
	id1, _ := os.ReadFile(filepath.Join(relays[1].dir, "relay.id"))
	id0, _ := os.ReadFile(filepath.Join(relays[0].dir, "relay.id"))
	if err := waitFleet(ctx, api, 2); err != nil {
		return err
	}
	if _, err := api.SetRelayDraining(ctx, strings.TrimSpace(string(id1)), true); err != nil {
		return err
	}

	first, _ := url.Parse("http://127.0.0.1:" + relays[0].port)
	second, _ := url.Parse("http://127.0.0.1:" + relays[1].port)
	devices := make([]string, n)
	for i := range n {
		devices[i] = fmt.Sprintf("idle-%05d", i)
	}
	// The agents run in worker processes of this binary, each with its own
	// backend: one process could not hold the file descriptors of 10,000
	// agents while they move.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	per := (n + workers - 1) / workers
	for w := range workers {
		lo, hi := w*per, min(n, (w+1)*per)
		if lo >= hi {
			break
		}
		cmd := exec.Command(self, "-agent-worker", first.String(), second.String(), fmt.Sprint(lo), fmt.Sprint(hi))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
	}
	count := func(id string) (int, error) {
		rs, err := api.ListRelays(ctx)
		if err != nil {
			return 0, err
		}
		for _, r := range rs {
			if r.ID == id {
				return r.AttachedDevices, nil
			}
		}
		return 0, nil
	}
	if err := benchkit.Poll(ctx, 5*time.Minute, 50*time.Millisecond, func() error {
		k, err := count(strings.TrimSpace(string(id0)))
		if err == nil && k < n {
			err = fmt.Errorf("%d of %d agents on the first relay", k, n)
		}
		return err
	}); err != nil {
		return err
	}
	if _, err := api.SetRelayDraining(ctx, strings.TrimSpace(string(id1)), false); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%d agents on the first relay\n", n)

	// Load: small GETs for random devices through either relay.
	var attempted, failed atomic.Int64
	var firstErr atomic.Value
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for w := range 8 {
		wg.Go(func() {
			for i := w; lctx.Err() == nil; i += 8 {
				base := []string{first.String(), second.String()}[i%2]
				attempted.Add(1)
				resp, err := c.Get(base + "/client/" + devices[(i*7919)%n] + "/")
				if err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
					}
				}
				if err != nil && lctx.Err() == nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	<-time.After(2 * time.Second)
	began := time.Now()
	if _, err := api.SetRelayDraining(ctx, strings.TrimSpace(string(id0)), true); err != nil {
		return err
	}
	var took time.Duration
	err = benchkit.Poll(ctx, 2*time.Minute, 50*time.Millisecond, func() error {
		k, err := count(strings.TrimSpace(string(id0)))
		if err == nil && k > 0 {
			err = fmt.Errorf("%d agents still on the drained relay", k)
		}
		took = time.Since(began)
		return err
	})
	stopLoad()
	wg.Wait()
	if err != nil {
		return err
	}
	out := fmt.Sprintf("- **drain of a relay holding %d idle native agents** (spread %s): all moved in **%s**; requests meanwhile: %d, failed **%d**\n",
		n, spread, took.Round(100*time.Millisecond), attempted.Load(), failed.Load())
	if e := firstErr.Load(); e != nil {
		out += fmt.Sprintf("  - first failure: `%v`\n", e)
	}
	fmt.Print(out)
	if md != "" {
		return os.WriteFile(md, []byte(out), 0o644)
	}
	return nil
}

// agentWorker runs the agents of devices [lo, hi) against the two relays,
// with a backend of its own, until it is killed.
func agentWorker(args []string) error {
	if len(args) != 4 {
		return fmt.Errorf("usage: -agent-worker FIRST SECOND LO HI")
	}
	first, _ := url.Parse(args[0])
	second, _ := url.Parse(args[1])
	var lo, hi int
	fmt.Sscan(args[2], &lo)
	fmt.Sscan(args[3], &hi)
	bu, _ := url.Parse(startBackend())
	ctx := context.Background()
	for i := lo; i < hi; i++ {
		a, err := agent.New(agent.Config{Relays: []*url.URL{first, second}, Device: fmt.Sprintf("idle-%05d", i), Backend: bu,
			Protocol: agent.ProtocolNative, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		go a.Run(ctx)
		if (i-lo)%250 == 249 {
			<-time.After(100 * time.Millisecond) // connect in waves, not all in one instant
		}
	}
	select {}
}

func waitFleet(ctx context.Context, api *control.Client, n int) error {
	return benchkit.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		rs, err := api.ListRelays(ctx)
		if err == nil && len(rs) < n {
			err = fmt.Errorf("%d relays", len(rs))
		}
		return err
	})
}

func waitReady(u string) error {
	return benchkit.Poll(context.Background(), 20*time.Second, 50*time.Millisecond, func() error {
		resp, err := http.Get(u)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	})
}

func startBackend() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	return "http://" + ln.Addr().String()
}
