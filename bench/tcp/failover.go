package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/service"
)

// runFailover runs three relay processes, each on a loopback address of
// its own (127.0.0.1-3) and listening on one mapped port, a device whose
// agent offers a TCP echo, and clients that open connection after
// connection to the mapped port of the relays that are up (as an L4
// balancer with health checks would), each held open for a while and
// echoing; then kills the device's holder with -9 and measures, per
// client, the time until a new connection through a survivor echoes, and
// counts the connections that broke.
func runFailover(ctx context.Context, cfg *config, dir string) error {
	bin, err := benchkit.Binary(cfg.bin, dir)
	if err != nil {
		return err
	}
	backend, err := echoBackend()
	if err != nil {
		return err
	}
	defer backend.Close()
	fdir, err := os.MkdirTemp(dir, "fleet-")
	if err != nil {
		return err
	}
	f, err := procfleet.Start(ctx, procfleet.Config{Bin: bin, Dir: fdir, Relays: 3,
		Host: func(n int) string { return fmt.Sprintf("127.0.0.%d", n) }})
	if err != nil {
		return err
	}
	defer f.Close()
	agents := procfleet.NewAgents(ctx)
	defer agents.Stop()
	const dev = "tcp-1"
	sv, err := service.Parse(svc + "=tcp://" + backend.Addr().String())
	if err != nil {
		return err
	}
	if err := agents.Start(agent.Config{Relays: f.Entries(), Device: dev, Backend: &url.URL{Scheme: "http", Host: "127.0.0.1:1"},
		Services: []service.Service{sv}}); err != nil {
		return err
	}
	if err := f.WaitOnline(ctx, []string{dev}); err != nil {
		return err
	}
	port, _ := strconv.Atoi(benchkit.FreePort())
	if _, err := f.API(nil).AddPort(ctx, control.PortRequest{Port: port, Target: dev + "/" + svc}); err != nil {
		return fmt.Errorf("map a port: %w", err)
	}
	addrOf := func(r *procfleet.Relay) string { return net.JoinHostPort(r.Host, strconv.Itoa(port)) }
	for _, r := range f.Relays() {
		if err := waitLine(ctx, addrOf(r)); err != nil {
			return fmt.Errorf("relay %d's mapped port: %w", r.N, err)
		}
	}
	online, err := f.Online(ctx)
	if err != nil {
		return err
	}
	var victim *procfleet.Relay
	for _, r := range f.Relays() {
		if r.ID == online[dev] {
			victim = r
		}
	}
	if victim == nil {
		return fmt.Errorf("no relay holds %s: %v", dev, online)
	}

	load := &tcpLoad{relays: f.Relays(), addrOf: addrOf, victim: victim, hold: 300 * time.Millisecond}
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range cfg.fWorkers {
		wg.Go(func() { load.worker(lctx, i) })
	}
	warm := time.NewTimer(2 * time.Second)
	select {
	case <-warm.C:
	case <-ctx.Done():
	}
	load.kill.Store(time.Now().UnixNano())
	if err := victim.Kill(); err != nil {
		stop()
		wg.Wait()
		return err
	}
	after := time.NewTimer(cfg.fDur)
	select {
	case <-after.C:
	case <-ctx.Done():
	}
	stop()
	wg.Wait()
	load.report(cfg, victim)
	return nil
}

// echoBackend serves a TCP echo on loopback until closed.
func echoBackend() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln, nil
}

func waitLine(ctx context.Context, addr string) error {
	return benchkit.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		return echo(c, make([]byte, 8))
	})
}

func echo(c net.Conn, msg []byte) error {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, len(msg)))
	return err
}

// tcpLoad is the failover's clients.
type tcpLoad struct {
	relays []*procfleet.Relay
	addrOf func(*procfleet.Relay) string
	victim *procfleet.Relay
	hold   time.Duration
	kill   atomic.Int64 // unix nanos of the kill; 0 before

	mu          sync.Mutex // guards the fields below
	recovered   []time.Duration
	never       int // workers with no success after the kill
	brokenVia   map[string]int
	failedNew   int // connections opened after the kill that did not echo
	okAfterKill int
}

// worker opens connection after connection, to the relays that are up in
// turn; each is held for l.hold, echoing every 50 ms.
func (l *tcpLoad) worker(ctx context.Context, i int) {
	var recovered time.Duration = -1
	defer func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if recovered >= 0 {
			l.recovered = append(l.recovered, recovered)
		} else if l.kill.Load() != 0 {
			l.never++
		}
	}()
	msg := []byte("ping-" + strconv.Itoa(i%100) + "xx")[:8]
	for n := i; ctx.Err() == nil; n++ {
		r := l.relays[n%len(l.relays)]
		if !r.Up() {
			continue // the balancer's health check took it out
		}
		opened := time.Now()
		c, err := net.DialTimeout("tcp", l.addrOf(r), time.Second)
		if err == nil {
			err = echo(c, msg)
		}
		kill := l.kill.Load()
		if err != nil {
			if c != nil {
				c.Close()
			}
			if kill != 0 && opened.UnixNano() > kill {
				l.mu.Lock()
				l.failedNew++
				l.mu.Unlock()
			}
			continue
		}
		if kill != 0 && opened.UnixNano() > kill && recovered < 0 {
			recovered = time.Since(time.Unix(0, kill))
		}
		if kill != 0 && opened.UnixNano() > kill {
			l.mu.Lock()
			l.okAfterKill++
			l.mu.Unlock()
		}
		if err := l.holdOpen(ctx, c, msg); err != nil && !errors.Is(err, context.Canceled) {
			l.mu.Lock()
			if l.brokenVia == nil {
				l.brokenVia = map[string]int{}
			}
			via := "a survivor"
			if r == l.victim {
				via = "the killed relay"
			}
			l.brokenVia[via]++
			l.mu.Unlock()
		}
		c.Close()
	}
}

// holdOpen echoes on c every 50 ms for l.hold.
func (l *tcpLoad) holdOpen(ctx context.Context, c net.Conn, msg []byte) error {
	end := time.NewTimer(l.hold)
	defer end.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end.C:
			return nil
		case <-tick.C:
			if err := echo(c, msg); err != nil {
				return err
			}
		}
	}
}

func (l *tcpLoad) report(cfg *config, victim *procfleet.Relay) {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.Sort(l.recovered)
	p50, p99 := percentiles(l.recovered)
	fmt.Printf("\nkill -9 of the device's holder (relay %d) under %d clients opening TCP connections to a mapped port of the relays up, each held %v:\n",
		victim.N, cfg.fWorkers, l.hold)
	fmt.Printf("  time until a new connection through a survivor echoes, per client: p50 %v, p99 %v (%d clients; %d never within %v)\n",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), len(l.recovered), l.never, cfg.fDur)
	fmt.Printf("  connections broken: %d through the killed relay, %d through a survivor (forwarded to the killed holder)\n",
		l.brokenVia["the killed relay"], l.brokenVia["a survivor"])
	fmt.Printf("  new connections after the kill: %d echoed, %d failed before the device was reachable again\n", l.okAfterKill, l.failedNew)
}
