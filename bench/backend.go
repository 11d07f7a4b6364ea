package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/bench/cpuprofile"
)

// backend is the device's service: an HTTP server on loopback in a process of
// its own, so that DIRECT (client → backend) crosses one process boundary and
// THROUGH a relay crosses two more. The process is this harness's own binary
// run again with -serve-backend (see serveBackend); one backend serves the
// direct and every relayed measurement of a run.
type backend struct {
	p   *proc
	url string // base URL
}

// backendFlag makes the harness binary serve the backend endpoints instead of
// running the benchmark. The harness passes it to itself; -h does not list it.
const backendFlag = "serve-backend"

// startBackend starts the backend process on a free loopback port and waits
// until it answers GET /small. With cfg.ProfileDir set, the backend writes
// its CPU profile to backend.pprof there when it is stopped.
func startBackend(ctx context.Context, cfg *config, dir string) (*backend, error) {
	self, err := selfBinary()
	if err != nil {
		return nil, err
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{"-" + backendFlag, addr}
	if cfg.ProfileDir != "" {
		args = append(args, "-cpuprofile", filepath.Join(cfg.ProfileDir, "backend.pprof"))
	}
	p, err := startProc("backend", self, args, nil, filepath.Join(dir, "backend.log"))
	if err != nil {
		return nil, err
	}
	b := &backend{p: p, url: "http://" + addr}
	if err := waitReady(ctx, p, b.url+"/small", 20*time.Second); err != nil {
		p.stop()
		return nil, err
	}
	return b, nil
}

// URL returns the backend's base URL.
func (b *backend) URL() string { return b.url }

// Close stops the backend process (SIGTERM, then SIGKILL after stopGrace).
func (b *backend) Close() { b.p.stop() }

// isBackendMode reports whether args ask for the backend: -serve-backend
// ADDR (or --serve-backend, or =ADDR) as the first argument.
func isBackendMode(args []string) bool { return isMode(args, backendFlag) }

// isMode reports whether args start with the hidden flag name.
func isMode(args []string, name string) bool {
	if len(args) == 0 || !strings.HasPrefix(args[0], "-") {
		return false
	}
	first, _, _ := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
	return first == name
}

// serveBackend is the backend process: it serves the benchmark endpoints on
// the loopback address of -serve-backend until ctx ends (SIGTERM or SIGINT),
// CPU-profiled into -cpuprofile's file if given.
func serveBackend(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench -"+backendFlag, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String(backendFlag, "", "serve the backend on this loopback `address` (host:port)")
	profile := fs.String("cpuprofile", "", "write the backend's CPU profile to `file` when it stops")
	if err := parseHidden(fs, args); err != nil {
		return err
	}
	if err := checkLoopback(backendFlag, *addr); err != nil {
		return &usageError{err}
	}
	if *profile != "" {
		stopProfile, err := cpuprofile.Start(*profile)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("backend listen: %w", err)
	}
	srv := &http.Server{Handler: backendHandler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("backend: %w", err)
	case <-ctx.Done():
		// Close does not close hijacked (websocket) connections, but the
		// process ends right after, which does.
		srv.Close()
		<-served
		return nil
	}
}

// parseHidden parses the flags of a hidden mode (the backend, a
// forwarder); a wrong command line is a usage error.
func parseHidden(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// selfBinary is this harness's binary, which serves the backend and the
// floor's forwarders when run again with their hidden flags.
func selfBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find this binary to run it again: %w", err)
	}
	return self, nil
}

// checkLoopback accepts host:port addresses on a loopback IP only; flag
// names the flag that gave addr.
func checkLoopback(flag, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-%s: %w", flag, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-%s: %q is not a loopback IP address", flag, host)
	}
	return nil
}

// backendHandler serves the benchmark endpoints: GET /small (2 bytes),
// GET /bytes?n=N, POST /upload and /ws (echo).
func backendHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /small", serveSmall)
	mux.HandleFunc("GET /bytes", serveBytes)
	mux.HandleFunc("POST /upload", serveUpload)
	mux.HandleFunc("/ws", serveWS)
	return mux
}

// handledHeader carries, in answers of /small, when the backend handled the
// request (Unix nanoseconds of the wall clock, which the backend process and
// the harness read from the same kernel), to split the latency into the way
// there and back.
const handledHeader = "X-Bench-Handled"

func serveSmall(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set(handledHeader, strconv.FormatInt(time.Now().UnixNano(), 10))
	w.Header().Set("Content-Length", "2")
	io.WriteString(w, "ok")
}

// serveBytes sends n bytes with a Content-Length.
func serveBytes(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil || n < 0 {
		http.Error(w, "want ?n=<bytes>", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	io.Copy(w, newPattern(n))
}

// serveUpload reads the body and answers with its length.
func serveUpload(w http.ResponseWriter, r *http.Request) {
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		http.Error(w, "read upload: "+err.Error(), http.StatusBadRequest)
		return
	}
	io.WriteString(w, strconv.FormatInt(n, 10))
}

// serveWS echoes every websocket message until the client closes.
func serveWS(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			return
		}
	}
}

// pattern is a reader of n filler bytes that allocates nothing per read.
type pattern struct{ left int64 }

func newPattern(n int64) *pattern { return &pattern{left: n} }

// filler is what pattern reads hand out, 64 KiB at a time at most.
var filler = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}()

func (p *pattern) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	n := copy(b[:min(int64(len(b)), p.left)], filler)
	p.left -= int64(n)
	return n, nil
}

// errStatus is a response with a status other than the one expected.
var errStatus = errors.New("unexpected status")

// checkStatus fails a response that is not 200 OK, with its start for the log.
func checkStatus(resp *http.Response) error {
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	return fmt.Errorf("%w %s: %q", errStatus, resp.Status, msg)
}
