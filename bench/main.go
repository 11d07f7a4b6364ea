// Command bench measures what the relay costs: it runs the same small-request
// latency, concurrent request rate, bulk download and upload throughput and
// websocket round-trip measurements once DIRECT (client → backend) and once
// THROUGH a relay (client → relay → agent → backend) for every agent protocol
// asked for, all on loopback in one run, and prints a table of the results
// with the relay/direct ratio of each.
//
// The relay and the agent are real switchboard processes, built into a
// temporary directory with 'go build' unless -bin names a binary. The backend
// is a process of its own too, this binary run again with a hidden
// -serve-backend ADDR flag, so that DIRECT crosses one process boundary as a
// real device's service would; the clients live in this process. Every loop
// is bounded by a count and a deadline, and the child processes are stopped
// (SIGTERM, then SIGKILL) when the run ends or is interrupted.
//
// Usage:
//
//	go run ./bench [-protocols longpoll,native] [-n 2000] [-duration 5s] [-md FILE]
//
// It reads /proc and is meant for Linux.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/switchboard-relay/switchboard/bench/cpuprofile"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := mainErr(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, new(*usageError)):
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// usageError marks a wrong command line.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// mainErr parses args and runs the benchmark, or serves the backend when
// args start with -serve-backend.
func mainErr(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if isBackendMode(args) {
		return serveBackend(ctx, args, stderr)
	}
	if isMode(args, forwardFlag) {
		return serveForward(ctx, args, stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.CPUProfile != "" {
		stopProfile, err := cpuprofile.Start(cfg.CPUProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	return run(ctx, cfg, stdout, stderr)
}

// parseFlags turns the command line into a completed, valid config.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	var protocols, tests, relayFlags, agentFlags, childEnv string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&protocols, "protocols", "longpoll", "agent `protocols` to measure, comma-separated (e.g. longpoll,native,native1: native is the agent's default tunnel version, native1 holds it to version 1); ones the agent does not know are skipped; \"floor\" measures two plain TCP forwarders instead of a relay and an agent")
	fs.StringVar(&protocols, "protocol", "longpoll", "alias of -protocols")
	fs.Func("peer", "measure a peer too: `NAME=PATH`, NAME starting with chisel (PATH its binary) or frp (PATH a directory holding frps and frpc); repeatable", func(s string) error {
		p, err := parsePeer(s)
		if err != nil {
			return err
		}
		cfg.Peers = append(cfg.Peers, p)
		return nil
	})
	fs.StringVar(&tests, "tests", strings.Join(testNames(), ","), "`measurements` to run, comma-separated")
	fs.StringVar(&cfg.Bin, "bin", "", "switchboard `binary` to use; empty builds one with 'go build' into a temp dir")
	fs.IntVar(&cfg.N, "n", 2000, "sequential small GETs timed for the latency percentiles")
	fs.IntVar(&cfg.Warmup, "warmup", 200, "untimed requests (and websocket round trips) before each timed series")
	fs.IntVar(&cfg.Concurrency, "c", 32, "concurrent connections for the request-rate test")
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Second, "how long the request-rate test runs")
	fs.IntVar(&cfg.DownloadMB, "download-mb", 100, "download size in MB (10^6 bytes)")
	fs.IntVar(&cfg.UploadMB, "upload-mb", 50, "upload size in MB (10^6 bytes); the long-poll relay caps bodies at 64 MiB by default")
	fs.IntVar(&cfg.WSRoundTrips, "ws-n", 1000, "websocket round trips timed")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "rounds the latency, request-rate and websocket tests run in, every target's share (1/rounds of -n, -duration, -ws-n) in turn in each, all targets running throughout, so that the machine's drift over the run falls on every target alike; 1 measures each target whole, one after the other")
	fs.IntVar(&cfg.WSMessageBytes, "ws-bytes", 32, "websocket message size in bytes")
	fs.DurationVar(&cfg.MaxSeries, "max-series", 90*time.Second, "deadline of each timed series; a series cut short reports how many samples it got")
	fs.IntVar(&cfg.Pending, "num-pending-requests", 32, "the agent's --num-pending-requests (concurrent polls)")
	fs.StringVar(&relayFlags, "relay-flags", "", "extra `flags` for 'switchboard serve', space-separated")
	fs.StringVar(&agentFlags, "agent-flags", "", "extra `flags` for 'switchboard agent', space-separated")
	fs.StringVar(&childEnv, "child-env", "", "extra environment for the relay and agent processes, space-separated `KEY=VALUE`s (e.g. GOMAXPROCS=1 GOGC=200)")
	fs.StringVar(&cfg.Markdown, "md", "", "also write the results as markdown to `file`")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write this process's CPU profile (the clients) to `file`")
	fs.StringVar(&cfg.ProfileDir, "profile-dir", "", "build the relay and agent with CPU profiling (bench/profiled) and write their profiles, and the backend's, into `dir`")
	fs.BoolVar(&cfg.Forwarded, "forwarded", false, "run two relays and send the load to the one that does not hold the device: every request is forwarded one hop (relay CPU is both relays'); the floor and peers are unchanged")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the temp dir (binary, relay data, process logs) and print its path")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, &usageError{err}
	}
	if fs.NArg() > 0 {
		return cfg, &usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	cfg.Protocols = splitList(protocols, ",")
	cfg.Tests = splitList(tests, ",")
	cfg.RelayFlags = strings.Fields(relayFlags)
	cfg.AgentFlags = strings.Fields(agentFlags)
	cfg.ChildEnv = strings.Fields(childEnv)
	cfg.Args = args
	if err := cfg.validate(); err != nil {
		return cfg, &usageError{err}
	}
	return cfg, nil
}

// splitList splits s at sep, dropping empty items.
func splitList(s, sep string) []string {
	var out []string
	for _, item := range strings.Split(s, sep) {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
