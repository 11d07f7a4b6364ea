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
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/agent"
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
	f, err := procfleet.Start(ctx, procfleet.Config{Bin: bin, Dir: dir, Relays: 3, Version: "v1",
		Args: []string{"--drain-timeout", "25s"}, Output: os.Stderr})
	if err != nil {
		return err
	}
	defer f.Close()
	backend, err := procfleet.StartBackend()
	if err != nil {
		return err
	}
	defer backend.Close()
	agents := procfleet.NewAgents(ctx)
	defer agents.Stop()
	var devices []string
	for i := range native + longpoll {
		proto, name := agent.ProtocolNative, fmt.Sprintf("n-%03d", i)
		if i >= native {
			proto, name = agent.ProtocolLongPoll, fmt.Sprintf("lp-%03d", i-native)
		}
		devices = append(devices, name)
		// Each agent knows every relay, first a different one, as behind a
		// balancer.
		if err := agents.Start(agent.Config{Relays: procfleet.Rotate(f.Entries(), i), Device: name, Backend: backend.URL(), Protocol: proto}); err != nil {
			return err
		}
	}
	if err := waitServing(ctx, f.Relays()[0], devices); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%d devices online\n", len(devices))

	l := startLoad(ctx, f.Relays(), devices)
	if _, err := f.Ctl(ctx, os.Stderr, "roll", "enable"); err != nil {
		return err
	}
	<-time.After(3 * time.Second) // the load runs a while before the roll
	began := time.Now()
	out, err := f.Roll(ctx, "v2", os.Stderr)
	took := time.Since(began)
	fmt.Fprint(os.Stderr, out)
	if err != nil {
		return fmt.Errorf("the roll failed: %w", err)
	}
	<-time.After(3 * time.Second) // and a while after
	l.stop()

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

// waitServing waits until every device answers through relay r.
func waitServing(ctx context.Context, r *procfleet.Relay, devices []string) error {
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	for _, d := range devices {
		err := benchkit.Poll(ctx, 60*time.Second, 50*time.Millisecond, func() error {
			resp, err := c.Get(r.URL() + "/client/" + d + "/small")
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return errors.New(resp.Status)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("device %s not served: %w", d, err)
		}
	}
	return nil
}

type stopper struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *stopper) stop() { s.cancel(); <-s.done }

// load is the mixed load: small GETs, streamed responses and websocket
// sessions, each through the next relay that is up.
type load struct {
	stopper
	gets, getsFailed                   atomic.Int64
	streams, streamsFailed, streamsCut atomic.Int64
	ws, wsFailed                       atomic.Int64
	firstErr                           atomic.Value
}

func startLoad(ctx context.Context, relays []*procfleet.Relay, devices []string) *load {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{stopper: stopper{cancel: cancel, done: make(chan struct{})}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	var next atomic.Int64
	pick := func() (*procfleet.Relay, string) {
		i := int(next.Add(1))
		for k := range len(relays) {
			if r := relays[(i+k)%len(relays)]; r.Up() {
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
		resp, err := client.Get(r.URL() + "/client/" + d + "/small")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("GET %s via relay %d: %s", d, r.N, resp.Status)
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
		resp, err := client.Get(r.URL() + "/client/" + d + "/stream")
		if err == nil {
			var n int64
			n, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && (resp.StatusCode != http.StatusOK || n != procfleet.StreamBytes) {
				err = fmt.Errorf("stream %s via relay %d: %s, %d bytes", d, r.N, resp.Status, n)
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
		if err := wsSession(ctx, "ws"+strings.TrimPrefix(r.URL(), "http")+"/client/"+d+"/ws"); err != nil && ctx.Err() == nil {
			fail(&l.wsFailed, fmt.Errorf("websocket %s via relay %d: %w", d, r.N, err))
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
