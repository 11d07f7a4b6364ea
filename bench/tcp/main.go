// Command tcp measures Switchboard's TCP services on loopback: one TCP
// stream's throughput and a small round trip through `switchboard connect`
// and through a mapped port, against the direct path, the floor (two plain
// forwarders) and peers given by path (chisel's R: reverse remote); the
// time connect adds to a connection's setup; the relay's memory per TCP
// connection with many open to one device; and, in a fleet of three relay
// processes, kill -9 of the device's holder under a TCP connection load.
//
//	go run ./bench/tcp -peer chisel=/path/to/chisel
//	go run ./bench/tcp -tests failover -failover-duration 10s
//
// Every process but the harness's clients is a process of its own: the
// backend (this binary run again with -serve-backend), the relay, the
// agent, connect's local listener, the forwarders, the peers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type config struct {
	bin      string
	peers    []peer
	tests    map[string]bool
	mb       int
	n        int
	rounds   int
	setupN   int
	conns    int
	fDur     time.Duration
	fWorkers int
	keep     bool
	heapDir  string
	through  map[string]bool // the paths of the many connections
}

// peer is a peer binary given by path.
type peer struct{ name, path string }

func main() {
	if len(os.Args) > 2 && os.Args[1] == "-serve-backend" {
		exit(serveBackend(os.Args[2]))
	}
	if len(os.Args) > 4 && os.Args[1] == "-serve-forward" && os.Args[3] == "-to" {
		exit(serveForward(os.Args[2], os.Args[4]))
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	exit(run(ctx, cfg))
}

func exit(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/tcp:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("bench/tcp", flag.ContinueOnError)
	cfg := &config{}
	var tests, through string
	fs.StringVar(&cfg.bin, "bin", "", "switchboard `binary` to use; empty builds one")
	fs.Func("peer", "a peer to measure too: chisel=`PATH` (its binary); repeatable", func(s string) error {
		name, path, ok := strings.Cut(s, "=")
		if !ok || !strings.HasPrefix(name, "chisel") || path == "" {
			return fmt.Errorf("-peer %q: want chisel…=PATH", s)
		}
		abs, err := filepath.Abs(path)
		cfg.peers = append(cfg.peers, peer{name, abs})
		return err
	})
	fs.StringVar(&tests, "tests", "stream,setup,conns,failover", "measurements, comma-separated: stream (throughput and round trip), setup (connect's added setup time), conns (many connections to one device), failover (kill -9 of the holder in a 3-relay fleet)")
	fs.IntVar(&cfg.mb, "mb", 200, "MB (10^6 bytes) sent over one TCP stream for its throughput")
	fs.IntVar(&cfg.n, "n", 2000, "round trips of 32 bytes timed on one connection")
	fs.IntVar(&cfg.rounds, "rounds", 5, "rounds the round trips are timed in, each path's n/rounds in turn in each, so that the machine's drift over the run falls on every path alike")
	fs.IntVar(&cfg.setupN, "setup-n", 500, "new connections timed for the setup time")
	fs.IntVar(&cfg.conns, "conns", 10000, "TCP connections held open at once to one device through a mapped port")
	fs.DurationVar(&cfg.fDur, "failover-duration", 6*time.Second, "how long the failover load runs after the kill")
	fs.IntVar(&cfg.fWorkers, "failover-workers", 16, "clients opening TCP connections in the failover load")
	fs.StringVar(&through, "conns-through", "connect,mapped port", "paths the many connections are measured through, comma-separated, in this order: connect, mapped port (each after the other in the same processes: measure one alone for its relay's memory unmixed)")
	fs.StringVar(&cfg.heapDir, "heap-profile-dir", "", "write the relay's heap profile, taken while the many connections are open, to this `dir`")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the temp dir (logs) and print its path")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if cfg.rounds < 1 || cfg.rounds > cfg.n {
		return nil, fmt.Errorf("-rounds %d: want 1 to -n (%d)", cfg.rounds, cfg.n)
	}
	cfg.tests = map[string]bool{}
	for _, t := range strings.Split(tests, ",") {
		switch t = strings.TrimSpace(t); t {
		case "stream", "setup", "conns", "failover":
			cfg.tests[t] = true
		default:
			return nil, fmt.Errorf("-tests: unknown measurement %q", t)
		}
	}
	cfg.through = map[string]bool{}
	for _, t := range strings.Split(through, ",") {
		switch t = strings.TrimSpace(t); t {
		case "connect", "mapped port":
			cfg.through[t] = true
		default:
			return nil, fmt.Errorf("-conns-through: unknown path %q", t)
		}
	}
	return cfg, nil
}

func run(ctx context.Context, cfg *config) error {
	dir, err := os.MkdirTemp("", "bench-tcp-")
	if err != nil {
		return err
	}
	if cfg.keep {
		fmt.Println("temp dir:", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	fmt.Printf("load average at start: %s\n", loadavg())
	defer func() { fmt.Printf("load average at end: %s\n", loadavg()) }()
	if cfg.tests["stream"] || cfg.tests["setup"] || cfg.tests["conns"] {
		if err := runPaths(ctx, cfg, dir); err != nil {
			return err
		}
	}
	if cfg.tests["failover"] {
		if err := runFailover(ctx, cfg, dir); err != nil {
			return err
		}
	}
	return nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// errGaveUp marks a wait that ran out.
var errGaveUp = errors.New("gave up waiting")
