package procfleet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Ctl runs `switchboard ctl ARGS` against the operator API of a relay
// that is up and returns its standard output; its standard error goes to
// stderr (none when nil).
func (f *Fleet) Ctl(ctx context.Context, stderr io.Writer, args ...string) (string, error) {
	c := f.API(nil)
	if c == nil {
		return "", ErrNoRelay
	}
	full := append([]string{"ctl", "--admin", c.BaseURL, "--token-file", f.TokenFile()}, args...)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, f.cfg.Bin, full...)
	cmd.Stdout, cmd.Stderr = &out, stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("switchboard ctl %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}

// Roll runs the real `switchboard ctl roll --expect-version version ARGS`
// (rolls must be enabled first: `ctl roll enable`), whose update step has this fleet restart the
// relay it names: SIGTERM, the relay's drain and exit, then a new process
// reporting version on the same data dir. It returns ctl's output; ctl's
// standard error goes to stderr.
func (f *Fleet) Roll(ctx context.Context, version string, stderr io.Writer, args ...string) (string, error) {
	// The update step names the relay in a FIFO, which a goroutine of
	// this fleet reads: no polling for it.
	fifo := filepath.Join(f.cfg.Dir, "roll.fifo")
	os.Remove(fifo)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		return "", fmt.Errorf("procfleet: roll: %w", err)
	}
	defer os.Remove(fifo)
	restarts := make(chan error, 1)
	go func() { restarts <- f.restartNamed(ctx, fifo, version) }()
	full := append([]string{"roll", "--expect-version", version, "--poll", "200ms",
		"--update-cmd", "echo {id} > " + fifo}, args...)
	out, err := f.Ctl(ctx, stderr, full...)
	// Tell the reader the roll is over: opening the FIFO for writing
	// releases its wait for a writer.
	if w, werr := os.OpenFile(fifo, os.O_WRONLY, 0); werr == nil {
		io.WriteString(w, rollOver+"\n")
		w.Close()
	}
	return out, errors.Join(err, <-restarts)
}

// rollOver is the line that ends restartNamed.
const rollOver = "-"

// restartNamed restarts, with version, each relay whose id a line of the
// FIFO names, until the line rollOver.
func (f *Fleet) restartNamed(ctx context.Context, fifo, version string) error {
	var errs []error
	for {
		r, err := os.Open(fifo) // waits for a writer
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			id := strings.TrimSpace(sc.Text())
			if id == rollOver {
				r.Close()
				return errors.Join(errs...)
			}
			if err := f.restartByID(ctx, id, version); err != nil {
				errs = append(errs, err)
			}
		}
		r.Close()
	}
}

// restartByID stops the relay of id gracefully and starts it again
// reporting version.
func (f *Fleet) restartByID(ctx context.Context, id, version string) error {
	for _, r := range f.Relays() {
		if r.ID != id {
			continue
		}
		r.Stop()
		r.SetVersion(version)
		return f.Restart(ctx, r)
	}
	return fmt.Errorf("procfleet: roll: no relay %q", id)
}
