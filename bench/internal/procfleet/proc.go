package procfleet

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is one child process: a relay, a balancer, a worker of agents.
// It dies with the harness (PDEATHSIG), even when the harness is killed
// with -9.
type Proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
	err  error         // how it exited; set before done closes
}

// StartProc starts bin with args, its stdout and stderr going to out (none
// when nil).
func StartProc(name, bin string, args []string, out io.Writer) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// ErrExited is returned when a process exits before what was awaited.
var ErrExited = errors.New("process exited")

// Err returns, once the process has exited, an error wrapping ErrExited
// that says how; nil while it runs.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return fmt.Errorf("%s: %w: %v", p.name, ErrExited, p.err)
}

// Signal sends sig to the process; an exited process is not an error.
func (p *Proc) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: %v: %w", p.name, sig, err)
	}
	return nil
}

// Kill kills the process with SIGKILL (which ends a frozen process too)
// and waits until it has exited.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop asks the process to exit with SIGTERM and waits grace for it, then
// kills it; it returns once the process has exited.
func (p *Proc) Stop(grace time.Duration) {
	p.Signal(syscall.SIGCONT) // a frozen process cannot act on SIGTERM
	p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.Kill()
	}
}

// tail returns the last n lines of the file at path, for an error report.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
