// Command profiled is the switchboard command with a CPU profile, for the
// benchmark harness: 'go run ./bench -profile-dir DIR' builds it in place of
// cmd/switchboard so that the relay and agent processes, which expose no
// profiling endpoint, can be profiled. When SWITCHBOARD_CPUPROFILE names a
// file, the whole life of the command is profiled into it; the profile is
// complete once the command returns (after SIGTERM, both serve and agent
// return normally).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/switchboard-relay/switchboard/bench/cpuprofile"
	"github.com/switchboard-relay/switchboard/internal/cli"
)

func main() {
	os.Exit(run())
}

// run runs the switchboard command under the CPU profiler and returns its
// exit code.
func run() int {
	if path := os.Getenv("SWITCHBOARD_CPUPROFILE"); path != "" {
		stop, err := cpuprofile.Start(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "profiled: %v\n", err)
			return cli.ExitFailure
		}
		defer stop()
	}
	return cli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
}
