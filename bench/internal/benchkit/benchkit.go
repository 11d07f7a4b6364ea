// Package benchkit holds what the benchmark harnesses share: building the
// switchboard binary, free loopback ports, and polling with a deadline, reading a metric.
package benchkit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"github.com/coder/websocket"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/switchboard-relay/switchboard/internal/control"
)

// Binary returns bin, or builds cmd/switchboard into dir and returns its
// path when bin is empty. Run it from within the module.
func Binary(bin, dir string) (string, error) {
	return Build(bin, dir, "switchboard", switchboardPkg)
}

// switchboardPkg is the switchboard command's package.
const switchboardPkg = "github.com/switchboard-relay/switchboard/cmd/switchboard"

// SharedBinary builds cmd/switchboard for the tests that run relay
// processes, into one directory per module checkout under the user's cache
// dir, holding a file lock meanwhile: the test packages of one `go test
// ./...` share one build, and go build leaves a binary it finds up to date
// untouched (a changed one it replaces by a rename, which processes still
// running it do not notice).
func SharedBinary() (string, error) {
	mod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(bytes.TrimSpace(mod))
	dir := filepath.Join(cache, "switchboard-tests", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close() // releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	bin := filepath.Join(dir, "switchboard")
	if out, err := exec.Command("go", "build", "-o", bin, switchboardPkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v: %s", switchboardPkg, err, out)
	}
	return bin, nil
}

// Build returns bin, or builds the package pkg (a path of this module or of
// one of its dependencies) into dir/name and returns that path when bin is
// empty.
func Build(bin, dir, name, pkg string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	bin = filepath.Join(dir, name)
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v: %s", pkg, err, out)
	}
	return bin, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// Poll calls f every interval until it returns nil, or returns f's last
// error once within has passed, or ctx's error when ctx ends.
func Poll(ctx context.Context, within, interval time.Duration, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// Gauge returns the value of the unlabelled metric name on the Prometheus
// page at metrics, or 0 when it cannot be read.
func Gauge(metrics, name string) float64 {
	resp, err := http.Get(metrics)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// SaveProfile fetches a profile from a relay's admin listener (a
// /debug/pprof/ URL) with the admin token and writes it to path.
func SaveProfile(u, token, path string) error {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// FreshRelays returns how many relays the operator API of one relay lists as
// fresh and not draining.
func FreshRelays(ctx context.Context, c *control.Client) (int, error) {
	rs, err := c.ListRelays(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rs {
		if r.Fresh && !r.Draining {
			n++
		}
	}
	return n, nil
}

// FirstOK asks url(i) for i = 0, 1, … every interval, on a new connection
// each time, until one answers 200, and returns how long after start that
// was; -1 when within has passed since start, or ctx ended, first.
func FirstOK(ctx context.Context, url func(i int) string, start time.Time, within, interval, timeout time.Duration) time.Duration {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Timeout: timeout, Transport: tr}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; time.Since(start) < within; i++ {
		resp, err := c.Get(url(i))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start)
			}
		}
		select {
		case <-ctx.Done():
			return -1
		case <-tick.C:
		}
	}
	return -1
}

// WebSocketEcho accepts a websocket and sends every message back, until
// the peer goes: the backend of the websocket measurements.
func WebSocketEcho(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	for {
		typ, msg, err := c.Read(r.Context())
		if err != nil {
			return
		}
		if err := c.Write(r.Context(), typ, msg); err != nil {
			return
		}
	}
}
