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
	heap := flag.String("heap-profile", "", "save the relay's heap profile, taken after the idle period, to this `file`")
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
	if err := run(options{conns: *conns, settle: *settle, version: *version, bin: *bin, heapProfile: *heap}); err != nil {
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
		benchkit.WebSocketEcho(w, r)
	})
	srv := &http.Server{Addr: addr, Handler: h}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	context.AfterFunc(ctx, func() { srv.Close() })
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// options are the command line's settings.
type options struct {
	conns       int
	settle      time.Duration
	version     int
	bin         string
	heapProfile string // empty saves none
}

// tally counts the websockets' outcomes.
type tally struct {
	open, refused, failed atomic.Int64
	firstErr              atomic.Value
	mu                    sync.Mutex  // guards codes
	codes                 map[int]int // refusals by status
}

func run(o options) error {
	n, settle, version, bin := o.conns, o.settle, o.version, o.bin
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
	var relayPID int
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

	t := &tally{codes: make(map[int]int)}
	start := time.Now()
	openAll(ctx, t, n, "ws://127.0.0.1:"+port+"/client/"+device+"/ws")
	fmt.Printf("%d websockets open in %v; refused %d %v, failed otherwise %d (first error: %v); idling %v\n",
		t.open.Load(), time.Since(start).Round(time.Millisecond), t.refused.Load(), t.codes, t.failed.Load(), t.firstErr.Load(), settle)
	time.Sleep(settle)
	rss := rssKB(relayPID)
	heap := benchkit.Gauge(metrics, "go_memstats_heap_inuse_bytes") - baseHeap
	stack := benchkit.Gauge(metrics, "go_memstats_stack_inuse_bytes") - baseStack
	per := float64(t.open.Load())
	if per == 0 {
		return errors.New("no websocket opened")
	}
	fmt.Printf("relay RSS %.1f MiB: %.1f KiB per open idle websocket (baseline subtracted), of which Go heap in use %.1f KiB and goroutine stacks %.1f KiB\n",
		float64(rss)/1024, float64(rss-baseRSS)/per, heap/1024/per, stack/1024/per)
	if o.heapProfile != "" {
		token, err := os.ReadFile(filepath.Join(dir, "data", "admin.token"))
		if err != nil {
			return fmt.Errorf("heap profile: %w", err)
		}
		if err := benchkit.SaveProfile("http://127.0.0.1:"+admin+"/debug/pprof/heap", strings.TrimSpace(string(token)), o.heapProfile); err != nil {
			return fmt.Errorf("heap profile: %w", err)
		}
	}
	if bad := t.refused.Load() + t.failed.Load(); bad > 0 {
		return fmt.Errorf("%d of %d websockets did not open", bad, n)
	}
	return nil
}

// openAll opens n websockets to url, 64 at a time, checks each with one
// echo and keeps it open until ctx ends; it returns once every attempt has
// ended, counted in t.
func openAll(ctx context.Context, t *tally, n int, url string) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, 64)
	for range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			openOne(ctx, t, url)
		})
	}
}

// openOne opens one websocket and checks it with one echo.
func openOne(ctx context.Context, t *tally, url string) {
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(dctx, url, nil)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			t.refused.Add(1)
			t.mu.Lock()
			t.codes[resp.StatusCode]++
			t.mu.Unlock()
		} else {
			t.failed.Add(1)
		}
		t.firstErr.CompareAndSwap(nil, err)
		return
	}
	if err := c.Write(dctx, websocket.MessageBinary, []byte("ping")); err == nil {
		_, _, err = c.Read(dctx)
	}
	if err != nil {
		t.failed.Add(1)
		t.firstErr.CompareAndSwap(nil, err)
		c.CloseNow()
		return
	}
	t.open.Add(1)
	context.AfterFunc(ctx, func() { c.CloseNow() })
}

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
