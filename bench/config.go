package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// device is the device name the agent serves during the benchmark.
const device = "bench"

// Names of the measurements, for -tests.
const (
	testLatency  = "latency"
	testRPS      = "rps"
	testDownload = "download"
	testUpload   = "upload"
	testWS       = "ws"
)

// config is one benchmark run's settings, filled from the command line.
type config struct {
	// Protocols are the agent protocols measured through the relay, each
	// with a fresh relay and agent. Ones the agent refuses are skipped.
	Protocols []string
	// Peers are other relays measured after the protocols, each started
	// from a binary given by -peer.
	Peers []peer
	// Tests are the measurements to run, a subset of allTests.
	Tests []string
	// Bin is a switchboard binary; empty builds one into the temp dir.
	Bin string
	// N is the number of sequential small GETs behind the latency percentiles.
	N int
	// Warmup is the number of untimed requests before each timed series.
	Warmup int
	// Concurrency is the number of connections of the request-rate test.
	Concurrency int
	// Duration is how long the request-rate test runs.
	Duration time.Duration
	// DownloadMB and UploadMB are the bulk transfer sizes in 10^6 bytes.
	DownloadMB, UploadMB int
	// WSRoundTrips is the number of timed websocket echoes.
	WSRoundTrips int
	// WSMessageBytes is the size of one websocket message.
	WSMessageBytes int
	// Rounds is how many rounds the latency, request-rate and websocket
	// tests run in: in each, every target runs its share of the test in
	// turn, with all the targets running throughout.
	Rounds int
	// MaxSeries bounds each timed series; a slow path reports fewer samples
	// instead of running for ever.
	MaxSeries time.Duration
	// Pending is the agent's --num-pending-requests.
	Pending int
	// RelayFlags and AgentFlags are passed on to the processes.
	RelayFlags, AgentFlags []string
	// ChildEnv is added to the relay's and agent's environment.
	ChildEnv []string
	// Markdown is a file to write the results to; empty writes none.
	Markdown string
	// CPUProfile is a file for this process's CPU profile; empty profiles nothing.
	CPUProfile string
	// ProfileDir receives the relay's and agent's CPU profiles; empty runs
	// the plain binary.
	ProfileDir string
	// Forwarded runs two relays on one NATS server and sends the load to
	// the one that does not hold the device, so that every request is
	// forwarded one hop; the relay CPU is both relays'. The floor and the
	// peers are measured as without it.
	Forwarded bool
	// Keep keeps the temp dir.
	Keep bool
	// Args is the command line, for the report.
	Args []string
}

// validate rejects settings that cannot give a measurement.
func (c *config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(len(c.Protocols) > 0, "-protocols names no protocol")
	check(len(c.Tests) > 0, "-tests names no measurement")
	for _, t := range c.Tests {
		check(slices.Contains(testNames(), t), "-tests: unknown measurement %q (known: %s)", t, strings.Join(testNames(), ","))
	}
	check(c.N > 0, "-n must be positive")
	check(c.Warmup >= 0, "-warmup must not be negative")
	check(c.Concurrency > 0, "-c must be positive")
	check(c.Duration > 0, "-duration must be positive")
	check(c.DownloadMB > 0, "-download-mb must be positive")
	check(c.UploadMB > 0, "-upload-mb must be positive")
	check(c.WSRoundTrips > 0, "-ws-n must be positive")
	check(c.WSMessageBytes > 0, "-ws-bytes must be positive")
	check(c.MaxSeries > 0, "-max-series must be positive")
	check(c.Rounds > 0 && c.Rounds <= c.N && c.Rounds <= c.WSRoundTrips, "-rounds must be 1 to -n and -ws-n")
	check(c.Pending > 0, "-num-pending-requests must be positive")
	for _, kv := range c.ChildEnv {
		check(strings.Contains(kv, "="), "-child-env: %q is not KEY=VALUE", kv)
	}
	check(c.Bin == "" || c.ProfileDir == "", "-bin and -profile-dir exclude each other: -profile-dir builds its own binary")
	return errors.Join(errs...)
}
