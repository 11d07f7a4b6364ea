// Package cli implements the switchboard command line: flag parsing, the
// subcommands serve, agent and ctl, and the mapping of errors to exit codes.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Exit codes of the switchboard command.
const (
	ExitOK      = 0
	ExitFailure = 1 // the command ran and failed
	ExitUsage   = 2 // the command line was wrong
)

// UsageError marks an error in the command line itself.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func usageErrorf(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

const usage = `usage: switchboard <command> [flags]

commands:
  serve   run a relay node
  agent   run the device side: connect a local service to the fleet
  ctl     operate the fleet (relays, devices, tokens)
  connect reach a device's TCP or UDP service from this machine
  version print the version

Run 'switchboard <command> -h' for the flags of a command.
`

// Version is the build's version, set with -ldflags "-X ...cli.Version=v1.2.3".
var Version = "dev"

// Run runs the switchboard command with args (without the program name) and
// returns the process exit code. It is the only place exit codes are decided.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := Main(ctx, args, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.As(err, new(*UsageError)):
		fmt.Fprintf(stderr, "switchboard: %v\n", err)
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "switchboard: %v\n", err)
		return ExitFailure
	}
}

// Main runs the switchboard command with args (without the program name).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageErrorf("no command given")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return runServe(ctx, rest, stdout, stderr)
	case "agent":
		return runAgent(ctx, rest, stdout, stderr)
	case "ctl":
		return runCtl(ctx, rest, stdout, stderr)
	case "connect":
		return runConnect(ctx, rest, os.Stdin, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "switchboard", Version)
		return nil
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageErrorf("unknown command %q", cmd)
	}
}

// newFlagSet returns a FlagSet for a subcommand that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("switchboard "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args into fs, wrapping failures as usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &UsageError{Err: err}
	}
	if fs.NArg() > 0 {
		return usageErrorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}
