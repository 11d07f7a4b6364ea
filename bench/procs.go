package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Package paths of the binaries the harness builds.
const (
	switchboardPkg = "github.com/switchboard-relay/switchboard/cmd/switchboard"
	profiledPkg    = "github.com/switchboard-relay/switchboard/bench/profiled"
)

// stopGrace is how long a child process has to exit after SIGTERM.
const stopGrace = 10 * time.Second

// buildBinary builds the switchboard command (or its profiling wrapper) into
// dir with a plain release build and returns its path.
func buildBinary(ctx context.Context, dir string, profiled bool) (string, error) {
	pkg := switchboardPkg
	if profiled {
		pkg = profiledPkg
	}
	out := filepath.Join(dir, "switchboard")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, stderr.Bytes())
	}
	return out, nil
}

// proc is a child process whose output goes to a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed when the process has exited
	err     error         // how it exited; set before exited closes
}

// startProc starts bin with args, its output in logPath and env added to
// this process's environment. The child is killed if this process dies.
func startProc(name, bin string, args, env []string, logPath string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// stop sends SIGTERM, waits stopGrace, then kills; it returns once the
// process has exited.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// exitCode returns the exit code once the process has exited, else -1.
func (p *proc) exitCode() int {
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// logTail returns the last lines of the process's output.
func (p *proc) logTail(lines int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// rssBytes returns the process's resident set size (VmRSS).
func (p *proc) rssBytes() (int64, error) {
	return readVmRSS(p.cmd.Process.Pid)
}

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// cpuTime returns the user and system CPU time the process has used.
func (p *proc) cpuTime() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("read cpu time: %w", err)
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: state is field 3, utime 14 and stime 15.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("read cpu time of pid %d: no command name in stat", p.cmd.Process.Pid)
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("read cpu time of pid %d: short stat line", p.cmd.Process.Pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("read cpu time: %w", err)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// readVmRSS reads VmRSS from /proc/pid/status.
func readVmRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read rss: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("read rss: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("read rss of pid %d: no VmRSS line", pid)
}

// freePort returns a loopback address with a port that was free just now.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// errGaveUp is returned by waitReady when the deadline passes.
var errGaveUp = errors.New("not ready in time")

// errExited is returned by waitReady when the process exits first.
var errExited = errors.New("process exited")

// waitReady polls url until it answers 200, p exits, ctx ends or timeout passes.
func waitReady(ctx context.Context, p *proc, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 3 * time.Second}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if get(ctx, client, url) == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s: %w (code %d): %v\n%s", p.name, errExited, p.exitCode(), p.err, p.logTail(5))
		case <-ctx.Done():
			return fmt.Errorf("%s: %w: %s did not answer 200 within %v\n%s", p.name, errGaveUp, url, timeout, p.logTail(5))
		case <-tick.C:
		}
	}
}
