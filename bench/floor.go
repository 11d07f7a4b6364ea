package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"time"
)

// floorProtocol is the pseudo-protocol "floor": in place of a relay and an
// agent, two plain TCP forwarders (this harness run again with
// -serve-forward) on the same path, client → forwarder → forwarder →
// backend, each copying every byte through a buffer in user space and doing
// nothing else: no HTTP, no multiplexing, one TCP connection per hop per
// client connection. No relay that reads what it forwards can cost less, so
// its ratios to direct are the ceiling of this machine for a path with two
// extra processes, against which the real protocols can be read.
const floorProtocol = "floor"

// forwardFlag makes the harness binary forward TCP connections instead of
// running the benchmark. The harness passes it to itself; -h does not list it.
const forwardFlag = "serve-forward"

// startFloor starts the two forwarders in front of the backend and returns
// them as a fleet whose device URL is the first forwarder.
func startFloor(ctx context.Context, o fleetOpts) (*fleet, error) {
	self, err := selfBinary()
	if err != nil {
		return nil, err
	}
	front, err := freePort()
	if err != nil {
		return nil, err
	}
	back, err := freePort()
	if err != nil {
		return nil, err
	}
	backendAddr := o.backendURL[len("http://"):]
	f := &fleet{floor: true}
	f.agent, err = startProc("agent", self, []string{"-" + forwardFlag, back, "-to", backendAddr}, childEnv(o, "agent"), filepath.Join(o.dir, "agent-floor.log"))
	if err != nil {
		return nil, err
	}
	f.relay, err = startProc("relay", self, []string{"-" + forwardFlag, front, "-to", back}, childEnv(o, "relay"), filepath.Join(o.dir, "relay-floor.log"))
	if err != nil {
		f.stop()
		return nil, err
	}
	f.relayURL = "http://" + front
	if err := waitReady(ctx, f.relay, f.deviceURL()+"/small", 20*time.Second); err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

// serveForward is a forwarder process: every connection accepted on
// -serve-forward's address is joined to a new connection to -to, until ctx
// ends.
func serveForward(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench -"+forwardFlag, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String(forwardFlag, "", "accept on this loopback `address` (host:port)")
	to := fs.String("to", "", "forward to this loopback `address` (host:port)")
	if err := parseHidden(fs, args); err != nil {
		return err
	}
	if err := errors.Join(checkLoopback(forwardFlag, *addr), checkLoopback("to", *to)); err != nil {
		return &usageError{err}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("forwarder listen: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	open := make(map[net.Conn]bool)
	defer func() { // at the end, cut the joined connections still open
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		in, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("forwarder accept: %w", err)
		}
		mu.Lock()
		open[in] = true
		mu.Unlock()
		wg.Go(func() {
			join(ctx, in, *to)
			mu.Lock()
			delete(open, in)
			mu.Unlock()
		})
	}
}

// join dials to and copies bytes both ways between it and in, passing each
// side's end of writing on, until both directions have ended.
func join(ctx context.Context, in net.Conn, to string) {
	defer in.Close()
	var d net.Dialer
	out, err := d.DialContext(ctx, "tcp", to)
	if err != nil {
		return
	}
	defer out.Close()
	var wg sync.WaitGroup
	wg.Go(func() { pipe(out, in) })
	pipe(in, out)
	wg.Wait()
}

// pipe copies src to dst through a 32 KiB buffer, then half-closes dst. The
// wrappers hide the TCP connections' ReadFrom and WriteTo, which would move
// the bytes inside the kernel (splice) where a relay must read them.
// A broken direction closes both connections, which ends the other.
func pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	if _, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf); err != nil {
		dst.Close()
		src.Close()
		return
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}
