// Command roll rehearses a rolling update of a Switchboard fleet under load:
// three `switchboard serve` processes sharing one NATS server (hosted by this
// process), native and long-poll agents in this process, and a mixed load of
// small requests, streamed responses and websocket echo sessions through the
// relays that are up. It runs the real `switchboard ctl roll`, whose update
// step asks this harness to restart each relay with a new version, and
// reports what failed.
//
//	go run ./bench/roll -native 200 -longpoll 20 -md results.md
package main

import (
	"bytes"
	"context"
	"errors"
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
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/store"
)

func main() {
	native := flag.Int("native", 200, "devices with a native agent")
	longpoll := flag.Int("longpoll", 20, "devices with a long-poll agent")
	bin := flag.String("bin", "", "switchboard binary (default: build one)")
	md := flag.String("md", "", "also write the results as Markdown to this file")
	flag.Parse()
	if err := run(*native, *longpoll, *bin, *md); err != nil {
		log.Fatal(err)
	}
}

type relayProc struct {
	n           int
	port, admin string
	dir         string
	cmd         *exec.Cmd
	done        chan struct{}
	up          atomic.Bool // takes new requests, as a balancer's health check sees it
}

func (r *relayProc) url() string { return "http://127.0.0.1:" + r.port }

type harness struct {
	bin, dir, natsURL string
	relays            []*relayProc
}

func run(native, longpoll int, bin, md string) error {
	dir, err := os.MkdirTemp("", "switchboard-roll-")
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
	h := &harness{bin: bin, dir: dir, natsURL: st.ClientURL()}
	for i := range 3 {
		r := &relayProc{n: i + 1, port: benchkit.FreePort(), admin: benchkit.FreePort(), dir: filepath.Join(dir, fmt.Sprintf("relay%d", i+1))}
		h.relays = append(h.relays, r)
		if err := h.start(ctx, r, "v1"); err != nil {
			return err
		}
	}
	defer h.stopAll()
	var entries []*url.URL
	for _, r := range h.relays {
		u, _ := url.Parse(r.url())
		entries = append(entries, u)
	}
	backend := startBackend()
	var devices []string
	for i := range native + longpoll {
		proto, name := agent.ProtocolNative, fmt.Sprintf("n-%03d", i)
		if i >= native {
			proto, name = agent.ProtocolLongPoll, fmt.Sprintf("lp-%03d", i-native)
		}
		devices = append(devices, name)
		bu, _ := url.Parse(backend)
		// Each agent knows every relay, first a different one, as behind a
		// balancer.
		rel := append(append([]*url.URL{}, entries[i%3:]...), entries[:i%3]...)
		a, err := agent.New(agent.Config{Relays: rel, Device: name, Backend: bu, Protocol: proto, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		go a.Run(ctx)
	}
	if err := h.waitServing(ctx, devices); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%d devices online\n", len(devices))

	l := startLoad(ctx, h, devices)
	restarts := h.watchRestarts(ctx)
	token, _ := os.ReadFile(filepath.Join(h.relays[0].dir, "admin.token"))
	tokenFile := filepath.Join(dir, "admin.token")
	os.WriteFile(tokenFile, token, 0o600)
	ctlRun := func(args ...string) (string, error) {
		full := append([]string{"ctl", "--admin", "http://127.0.0.1:" + h.relays[1].admin, "--token-file", tokenFile}, args...)
		var out bytes.Buffer
		cmd := exec.Command(bin, full...)
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		err := cmd.Run()
		return out.String(), err
	}
	if _, err := ctlRun("roll", "enable"); err != nil {
		return err
	}
	<-time.After(3 * time.Second) // the load runs a while before the roll
	began := time.Now()
	out, err := ctlRun("roll", "--expect-version", "v2", "--poll", "200ms",
		"--update-cmd", "touch "+filepath.Join(dir, "restart-")+"{id}")
	took := time.Since(began)
	fmt.Fprint(os.Stderr, out)
	if err != nil {
		return fmt.Errorf("the roll failed: %w", err)
	}
	<-time.After(3 * time.Second) // and a while after
	l.stop()
	restarts.stop()

	var b strings.Builder
	fmt.Fprintf(&b, "# Rolling update under load\n\n")
	fmt.Fprintf(&b, "Three `switchboard serve` processes on one NATS; %d native and %d long-poll agents; `switchboard ctl roll --expect-version v2` whose update step restarts each relay (SIGTERM, then a new process with `--report-version v2`). The load goes to the relays that are up, as through a balancer whose health check follows `/readyz`; it started 3 s before the roll and ran 3 s after.\n\n", native, longpoll)
	fmt.Fprintf(&b, "- roll of 3 relays: **%s**\n", took.Round(100*time.Millisecond))
	fmt.Fprintf(&b, "- small GETs: %d, failed **%d**\n", l.gets.Load(), l.getsFailed.Load())
	fmt.Fprintf(&b, "- streamed responses (2 s each): %d, failed **%d**, of which cut at a drain deadline: %d\n", l.streams.Load(), l.streamsFailed.Load(), l.streamsCut.Load())
	fmt.Fprintf(&b, "- websocket echo sessions (3 s, a message every 100 ms): %d, failed **%d**\n", l.ws.Load(), l.wsFailed.Load())
	if e := l.firstErr.Load(); e != nil {
		fmt.Fprintf(&b, "- first failure: `%v`\n", e)
	}
	fmt.Print(b.String())
	if md != "" {
		return os.WriteFile(md, []byte(b.String()), 0o644)
	}
	return nil
}

func (h *harness) start(ctx context.Context, r *relayProc, version string) error {
	r.cmd = exec.Command(h.bin, "serve", "--listen", "127.0.0.1:"+r.port, "--admin-listen", "127.0.0.1:"+r.admin,
		"--data", r.dir, "--nats", h.natsURL, "--advertise", r.url(), "--report-version", version,
		"--allow-anonymous-users", "--allow-anonymous-agents", "--log-level", "error", "--drain-timeout", "25s")
	r.cmd.Stderr = os.Stderr
	if err := r.cmd.Start(); err != nil {
		return err
	}
	r.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(r.cmd, r.done)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://127.0.0.1:" + r.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				r.up.Store(true)
				return nil
			}
		}
		<-time.After(50 * time.Millisecond)
	}
	return fmt.Errorf("relay %d did not start", r.n)
}

func (h *harness) stopAll() {
	for _, r := range h.relays {
		if r.cmd != nil && r.cmd.Process != nil {
			r.cmd.Process.Kill()
			<-r.done
		}
	}
}

func (h *harness) waitServing(ctx context.Context, devices []string) error {
	deadline := time.Now().Add(60 * time.Second)
	c := &http.Client{Timeout: 5 * time.Second}
	for _, d := range devices {
		for {
			resp, err := c.Get(h.relays[0].url() + "/client/" + d + "/small")
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("device %s not served", d)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

type stopper struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *stopper) stop() { s.cancel(); <-s.done }

// watchRestarts restarts each relay whose id the update step names in a
// file: SIGTERM, wait for the exit, then start it again with version v2.
func (h *harness) watchRestarts(ctx context.Context) *stopper {
	ctx, cancel := context.WithCancel(ctx)
	s := &stopper{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		seen := map[string]bool{}
		for ctx.Err() == nil {
			entries, _ := os.ReadDir(h.dir)
			for _, e := range entries {
				if !strings.HasPrefix(e.Name(), "restart-") || seen[e.Name()] {
					continue
				}
				seen[e.Name()] = true
				id := strings.TrimPrefix(e.Name(), "restart-")
				for _, r := range h.relays {
					rid, _ := os.ReadFile(filepath.Join(r.dir, "relay.id"))
					if strings.TrimSpace(string(rid)) != id {
						continue
					}
					r.up.Store(false)
					r.cmd.Process.Signal(syscall.SIGTERM)
					<-r.done
					if err := h.start(ctx, r, "v2"); err != nil {
						log.Print(err)
					}
				}
			}
			<-time.After(20 * time.Millisecond)
		}
	}()
	return s
}

// load is the mixed load: small GETs, streamed responses and websocket
// sessions, each through the next relay that is up.
type load struct {
	stopper
	gets, getsFailed                   atomic.Int64
	streams, streamsFailed, streamsCut atomic.Int64
	ws, wsFailed                       atomic.Int64
	firstErr                           atomic.Value
}

func startLoad(ctx context.Context, h *harness, devices []string) *load {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{stopper: stopper{cancel: cancel, done: make(chan struct{})}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	var next atomic.Int64
	pick := func() (*relayProc, string) {
		i := int(next.Add(1))
		for k := range len(h.relays) {
			if r := h.relays[(i+k)%len(h.relays)]; r.up.Load() {
				return r, devices[i%len(devices)]
			}
		}
		return nil, ""
	}
	fail := func(counter *atomic.Int64, err error) {
		counter.Add(1)
		l.firstErr.CompareAndSwap(nil, err.Error())
	}
	var wg sync.WaitGroup
	worker := func(every time.Duration, f func()) {
		wg.Go(func() {
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					wg.Go(f)
				}
			}
		})
	}
	worker(10*time.Millisecond, func() {
		r, d := pick()
		if r == nil {
			return
		}
		l.gets.Add(1)
		resp, err := client.Get(r.url() + "/client/" + d + "/small")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("GET %s via relay %d: %s", d, r.n, resp.Status)
			}
		}
		if err != nil {
			fail(&l.getsFailed, err)
		}
	})
	worker(200*time.Millisecond, func() {
		r, d := pick()
		if r == nil {
			return
		}
		l.streams.Add(1)
		resp, err := client.Get(r.url() + "/client/" + d + "/stream")
		if err == nil {
			var n int64
			n, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && (resp.StatusCode != http.StatusOK || n != 20*7) {
				err = fmt.Errorf("stream %s via relay %d: %s, %d bytes", d, r.n, resp.Status, n)
			}
			if err != nil && resp.StatusCode == http.StatusOK {
				l.streamsCut.Add(1)
			}
		}
		if err != nil {
			fail(&l.streamsFailed, err)
		}
	})
	worker(300*time.Millisecond, func() {
		r, d := pick()
		if r == nil || !strings.HasPrefix(d, "n-") {
			return // long-poll agents carry websockets too, but slowly; keep the sessions on native agents
		}
		l.ws.Add(1)
		if err := wsSession(ctx, "ws"+strings.TrimPrefix(r.url(), "http")+"/client/"+d+"/ws"); err != nil && ctx.Err() == nil {
			fail(&l.wsFailed, fmt.Errorf("websocket %s via relay %d: %w", d, r.n, err))
		}
	})
	go func() {
		<-ctx.Done()
		wg.Wait()
		close(l.done)
	}()
	return l
}

func wsSession(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		return err
	}
	defer c.CloseNow()
	for i := range 30 {
		msg := []byte(fmt.Sprint("ping ", i))
		if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
			return err
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, msg) {
			return errors.New("echo mismatch")
		}
		<-time.After(100 * time.Millisecond)
	}
	return c.Close(websocket.StatusNormalClosure, "")
}

func startBackend() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		for i := range 20 {
			fmt.Fprintf(w, "chunk%d\n", i%10)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
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
	go http.Serve(ln, mux)
	return "http://" + ln.Addr().String()
}
