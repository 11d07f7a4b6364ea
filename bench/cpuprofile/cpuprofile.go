// Package cpuprofile starts a CPU profile into a file, for the benchmark
// harness and the profiled switchboard command it builds.
package cpuprofile

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// Start profiles this process into path until the returned function is called.
func Start(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
