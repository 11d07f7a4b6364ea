// Command wsmany opens many websockets at once through one relay and one
// agent, and reports how many the relay refused and its memory per open,
// idle websocket.
//
// It starts a relay and an agent (switchboard processes, built unless -bin
// names a binary) and a websocket echo backend (this binary run again with
// -serve-echo), opens -conns websockets to the device through the relay,
// each checked with one echo, holds them idle for -settle, and reads the
// relay's RSS, Go heap and stacks against the baseline with the agent
// connected and nothing open.
//
//	go run ./bench/wsmany -conns 10000 [-tunnel-version 2]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
)

// device is the name the agent serves.
const device = "ws"

func main() {
	echo := flag.String("serve-echo", "", "serve the websocket echo backend on this loopback `address` (the harness runs itself so)")
	conns := flag.Int("conns", 10000, "websockets to hold open at once")
	settle := flag.Duration("settle", 5*time.Second, "how long the websockets stay idle before measuring")
	version := flag.Int("tunnel-version", 2, "the agent's --tunnel-version: 2 (its default) or 1")
	bin := flag.String("bin", "", "switchboard binary (default: build one)")
	flag.StringVar(&heapProfile, "heap-profile", "", "save the relay's heap profile, taken after the idle period, to this `file`")
	flag.Parse()
	if *echo != "" {
		if err := serveEcho(*echo); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *version != 1 && *version != 2 {
		log.Fatalf("-tunnel-version %d: use 1 or 2", *version)
	}
	if err := run(*conns, *settle, *version, *bin); err != nil {
		log.Fatal(err)
	}
}

// serveEcho answers every websocket with an echo of each message, and any
// other request with 200, until SIGTERM.
func serveEcho(addr string) error {
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		return fmt.Errorf("-serve-echo %q: want 127.0.0.1:PORT", addr)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			w.Write([]byte("ok"))
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				return
			}
		}
	})
	srv := &http.Server{Addr: addr, Handler: h}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func run(n int, settle time.Duration, version int, bin string) error {
	dir, err := os.MkdirTemp("", "switchboard-wsmany-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin, err = benchkit.Binary(bin, dir); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	backend := "127.0.0.1:" + benchkit.FreePort()
	port, admin := benchkit.FreePort(), benchkit.FreePort()
	relayURL := "http://127.0.0.1:" + port
	for _, c := range []struct {
		name string
		bin  string
		args []string
	}{
		{"backend", self, []string{"-serve-echo", backend}},
		{"relay", bin, []string{"serve", "--listen", "127.0.0.1:" + port, "--admin-listen", "127.0.0.1:" + admin,
			"--data", filepath.Join(dir, "data"), "--allow-anonymous-agents", "--allow-anonymous-users", "--log-level", "warn"}},
		{"agent", bin, []string{"agent", "--relay", relayURL, "--device", device, "--backend", "http://" + backend,
			"--tunnel-version", strconv.Itoa(version), "--log-level", "warn"}},
	} {
		cmd := exec.Command(c.bin, c.args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if f, err := os.Create(filepath.Join(dir, c.name+".log")); err == nil {
			cmd.Stdout, cmd.Stderr = f, f
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", c.name, err)
		}
		defer func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}()
		if c.name == "relay" {
			relayPID = cmd.Process.Pid
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	probe := &http.Client{Timeout: 2 * time.Second}
	if err := benchkit.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		resp, err := probe.Get(relayURL + "/client/" + device + "/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("the device did not answer through the relay: %w", err)
	}
	metrics := "http://127.0.0.1:" + admin + "/metrics"
	baseRSS := rssKB(relayPID)
	baseHeap, baseStack := benchkit.Gauge(metrics, "go_memstats_heap_inuse_bytes"), benchkit.Gauge(metrics, "go_memstats_stack_inuse_bytes")
	fmt.Printf("relay pid %d: baseline RSS %.1f MiB with the agent connected (tunnel version %d)\n", relayPID, float64(baseRSS)/1024, version)

	var open, refused, failed atomic.Int64
	var firstErr atomic.Value
	codes := make(map[int]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	start := time.Now()
	msg := []byte("ping")
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
			defer dcancel()
			c, resp, err := websocket.Dial(dctx, "ws://127.0.0.1:"+port+"/client/"+device+"/ws", nil)
			if err != nil {
				if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
					refused.Add(1)
					mu.Lock()
					codes[resp.StatusCode]++
					mu.Unlock()
				} else {
					failed.Add(1)
				}
				firstErr.CompareAndSwap(nil, err)
				return
			}
			if err := c.Write(dctx, websocket.MessageBinary, msg); err == nil {
				_, _, err = c.Read(dctx)
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
				c.CloseNow()
				return
			}
			open.Add(1)
			context.AfterFunc(ctx, func() { c.CloseNow() })
		})
	}
	wg.Wait()
	fmt.Printf("%d websockets open in %v; refused %d %v, failed otherwise %d (first error: %v); idling %v\n",
		open.Load(), time.Since(start).Round(time.Millisecond), refused.Load(), codes, failed.Load(), firstErr.Load(), settle)
	time.Sleep(settle)
	rss := rssKB(relayPID)
	heap := benchkit.Gauge(metrics, "go_memstats_heap_inuse_bytes") - baseHeap
	stack := benchkit.Gauge(metrics, "go_memstats_stack_inuse_bytes") - baseStack
	per := float64(open.Load())
	if per == 0 {
		return errors.New("no websocket opened")
	}
	fmt.Printf("relay RSS %.1f MiB: %.1f KiB per open idle websocket (baseline subtracted), of which Go heap in use %.1f KiB and goroutine stacks %.1f KiB\n",
		float64(rss)/1024, float64(rss-baseRSS)/per, heap/1024/per, stack/1024/per)
	if heapProfile != "" {
		token, err := os.ReadFile(filepath.Join(dir, "data", "admin.token"))
		if err != nil {
			return fmt.Errorf("heap profile: %w", err)
		}
		if err := benchkit.SaveProfile("http://127.0.0.1:"+admin+"/debug/pprof/heap", strings.TrimSpace(string(token)), heapProfile); err != nil {
			return fmt.Errorf("heap profile: %w", err)
		}
	}
	if refused.Load()+failed.Load() > 0 {
		return fmt.Errorf("%d of %d websockets did not open", refused.Load()+failed.Load(), n)
	}
	return nil
}

// heapProfile, when set, receives the relay's heap profile.
var heapProfile string

// relayPID is the relay process's id, for its RSS.
var relayPID int

func rssKB(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return kb
		}
	}
	return 0
}
