package cli

import (
	"context"
	"fmt"
	"io"
	"time"
)

// defaultStopWait is how long 'ctl stop' waits for the relay to exit.
const defaultStopWait = 60 * time.Second

// runStop runs 'switchboard ctl stop': the relay at --admin drains as on
// SIGTERM and exits, and the command waits until it no longer serves. A Kubernetes preStop hook
// runs it, so that the drain is over before the kubelet's own signal.
func runStop(ctx context.Context, g *ctlGlobals, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ctl stop", stderr)
	g.register(fs)
	wait := fs.Duration("wait", defaultStopWait, "how `long` to wait for the relay to drain and stop")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *wait <= 0 {
		return usageErrorf("ctl stop: --wait %s: give a positive duration", *wait)
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	if err := c.Stop(ctx, *wait); err != nil {
		return g.explain(err)
	}
	fmt.Fprintf(stdout, "relay at %s drained and stopped\n", g.admin)
	return nil
}
