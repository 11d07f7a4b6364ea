package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// requireTools, when set (CI sets it), turns a missing tool into a failure
// instead of a skip.
const requireTools = "SWITCHBOARD_REQUIRE_DEPLOY_TOOLS"

// tool returns the path of the program name, from the environment variable
// env if it is set, else from PATH. It skips the test when the program is
// missing, or fails it when requireTools is set.
func tool(t *testing.T, name, env string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv(requireTools) != "" {
		t.Fatalf("%s not found (set %s or put it on PATH): %v", name, env, err)
	}
	t.Skipf("%s not found (set %s or put it on PATH; .ci/run installs it)", name, env)
	return ""
}

// root is the repository's root directory.
func root(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// deployPath is a path under deploy/.
func deployPath(t *testing.T, elem ...string) string {
	return filepath.Join(append([]string{root(t), "deploy"}, elem...)...)
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// switchboard builds the switchboard binary once per test run.
func switchboard(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "switchboard-deploy-test")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "switchboard")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/switchboard")
		cmd.Dir = root(t)
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build ./cmd/switchboard: %v\n%s", buildErr, buildOut)
	}
	return binPath
}

// run runs a command and returns its combined output, failing the test if it
// fails.
func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(name), args, err, out)
	}
	return out
}
