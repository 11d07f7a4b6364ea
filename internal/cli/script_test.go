package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/cli"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// TestMain makes the test binary also the switchboard command of the
// scripts in testdata/script (run as a real process, so that exit codes,
// stdout, stderr and signals are the command's own), and fails the package
// when a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	testscript.Main(leakChecked{m}, map[string]func(){
		"switchboard": func() { os.Exit(cli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

// leakChecked runs the tests, then looks for goroutines left behind, as
// goleak.VerifyTestMain does.
type leakChecked struct{ m *testing.M }

func (l leakChecked) Run() int {
	code := l.m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: goroutines left behind by a passing test run: %v\n", err)
		return 1
	}
	return 0
}

// TestScripts runs the ctl scenarios in testdata/script, each against a
// fleet of its own; see startFleet for what a script finds in its
// environment, and scriptCmds for the commands it may use besides
// switchboard.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                "testdata/script",
		Setup:              startFleet,
		Cmds:               scriptCmds,
		RequireUniqueNames: true,
	})
}

// Timing of the scripts' fleets: beats fast enough for scripts to see
// changes at once, with a fresh window wide enough that a machine loaded by
// the race detector does not make relays look stale.
const (
	scriptBeat     = 200 * time.Millisecond
	scriptFresh    = 3 * time.Second
	scriptLeaseTTL = time.Second
	fleetStartWait = 20 * time.Second
)

// startFleet starts three relays sharing one NATS server and tells the
// script about them:
//
//	ADMIN, ADMIN2, ADMIN3        the relays' admin URLs
//	PUBLIC1                      relay 1's public URL, for agents
//	RELAY1, RELAY2, RELAY3       the relays' ids
//	TOKEN_FILE                   relay 1's admin token
//	PUBLIC1_PORT                 relay 1's public listener's port
//	FREE_PORT                    a TCP port free when the script began
//
// Relay 1's data directory is $WORK/switchboard-data, the ctl default, so
// that 'switchboard ctl --admin $ADMIN …' needs no --token-file. Every relay
// already sees all three fresh, and accepts relay 1's admin token, when the
// script begins.
func startFleet(env *testscript.Env) error {
	ctx, cancel := context.WithTimeout(context.Background(), fleetStartWait)
	defer cancel()
	hub, err := store.Open(ctx, store.Config{DataDir: filepath.Join(env.WorkDir, "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		return fmt.Errorf("start NATS: %w", err)
	}
	env.Defer(func() { hub.Close() })
	dirs := []string{"switchboard-data", "relay2", "relay3"}
	regions := []string{"eu", "eu", "us"}
	nodes := make([]*node.Node, len(dirs))
	for i := range nodes {
		cfg := node.Config{
			Listen:      "127.0.0.1:0",
			AdminListen: "127.0.0.1:0",
			DataDir:     filepath.Join(env.WorkDir, dirs[i]),
			NATS:        []string{hub.ClientURL()},
			Region:      regions[i],
			Fleet:       fleet.Config{BeatInterval: scriptBeat, FreshAfter: scriptFresh, LeaseTTL: scriptLeaseTTL},
			Version:     "script",
		}
		n, err := node.Start(ctx, cfg)
		if err != nil {
			return fmt.Errorf("start relay %d: %w", i+1, err)
		}
		env.Defer(func() { n.Close() })
		nodes[i] = n
	}
	token, err := os.ReadFile(nodes[0].AdminTokenPath())
	if err != nil {
		return err
	}
	if err := waitFleet(ctx, nodes, strings.TrimSpace(string(token))); err != nil {
		return err
	}
	for i, n := range nodes {
		suffix := strconv.Itoa(i + 1)
		if i == 0 {
			env.Setenv("ADMIN", "http://"+n.AdminAddr())
			env.Setenv("PUBLIC1", "http://"+n.Addr())
		} else {
			env.Setenv("ADMIN"+suffix, "http://"+n.AdminAddr())
		}
		env.Setenv("RELAY"+suffix, n.Fleet().ID())
	}
	env.Setenv("TOKEN_FILE", nodes[0].AdminTokenPath())
	_, port, _ := net.SplitHostPort(nodes[0].Addr())
	env.Setenv("PUBLIC1_PORT", port)
	free, err := freePort()
	if err != nil {
		return err
	}
	env.Setenv("FREE_PORT", strconv.Itoa(free))
	// A binary built with -race sleeps a second on exit by default; the
	// scripts run it dozens of times.
	env.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return nil
}

// freePort returns a TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitFleet polls until every node sees every node fresh and accepts the
// admin token, or ctx ends.
func waitFleet(ctx context.Context, nodes []*node.Node, adminToken string) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := fleetReady(nodes, adminToken)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the fleet did not come up: %w", err)
		case <-tick.C:
		}
	}
}

func fleetReady(nodes []*node.Node, adminToken string) error {
	for i, n := range nodes {
		fresh := 0
		for _, r := range n.Fleet().Relays() {
			if r.Fresh {
				fresh++
			}
		}
		if fresh != len(nodes) {
			return fmt.Errorf("relay %d sees %d fresh relays, want %d", i+1, fresh, len(nodes))
		}
		if _, err := n.Tokens().Authenticate(adminToken); err != nil {
			return fmt.Errorf("relay %d refuses relay 1's admin token: %w", i+1, err)
		}
	}
	return nil
}

// scriptCmds are the scripts' commands besides switchboard and the
// standard ones:
//
//	waitfor [-stdout REGEXP]... [-json PATH=VALUE]... TIMEOUT PROGRAM ARGS...
//	    runs PROGRAM until it succeeds and its stdout matches every
//	    REGEXP and holds every VALUE (as the json command checks), failing
//	    after TIMEOUT (e.g. 5s); stdout and stderr are then the last run's.
//	[!] json [-len] PATH WANT
//	    checks the JSON value at PATH in stdout; see jsonAt for PATH.
//	    With -len, WANT is the length of the array, object or string.
//	exitcode CODE PROGRAM ARGS...
//	    runs PROGRAM and checks that it exits with CODE.
var scriptCmds = map[string]func(ts *testscript.TestScript, neg bool, args []string){
	"waitfor":  cmdWaitfor,
	"json":     cmdJSON,
	"exitcode": cmdExitCode,
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func cmdWaitfor(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("usage: waitfor [-stdout REGEXP]... [-json PATH=VALUE]... TIMEOUT PROGRAM ARGS... (no !)")
	}
	fs := flag.NewFlagSet("waitfor", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var patterns, checks stringList
	fs.Var(&patterns, "stdout", "a regexp stdout must match")
	fs.Var(&checks, "json", "PATH=VALUE stdout must hold")
	ts.Check(fs.Parse(args))
	if fs.NArg() < 2 {
		ts.Fatalf("usage: waitfor [-stdout REGEXP]... [-json PATH=VALUE]... TIMEOUT PROGRAM ARGS...")
	}
	timeout, err := time.ParseDuration(fs.Arg(0))
	ts.Check(err)
	var regexps []*regexp.Regexp
	for _, p := range patterns {
		re, err := regexp.Compile("(?m)" + p)
		ts.Check(err)
		regexps = append(regexps, re)
	}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ts.Exec(fs.Arg(1), fs.Args()[2:]...)
		if err == nil {
			err = checkStdout(ts.ReadFile("stdout"), regexps, checks)
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("waitfor: not done within %v: %v", timeout, err)
		}
		<-tick.C
	}
}

// checkStdout says how stdout fails to match every regexp or hold every
// PATH=VALUE check.
func checkStdout(stdout string, regexps []*regexp.Regexp, checks []string) error {
	for _, re := range regexps {
		if !re.MatchString(stdout) {
			return fmt.Errorf("stdout does not match %q", re)
		}
	}
	for _, c := range checks {
		path, want, ok := strings.Cut(c, "=")
		// A selector such as .[id=rl-1] holds '=' too: cut at the last one
		// outside brackets.
		if i := strings.LastIndex(c, "]"); i >= 0 {
			path, want, ok = strings.Cut(c[i:], "=")
			path = c[:i] + path
		}
		if !ok {
			return fmt.Errorf("-json %q: want PATH=VALUE", c)
		}
		if err := jsonCheck(stdout, path, want, false); err != nil {
			return err
		}
	}
	return nil
}

func cmdJSON(ts *testscript.TestScript, neg bool, args []string) {
	byLen := len(args) > 0 && args[0] == "-len"
	if byLen {
		args = args[1:]
	}
	if len(args) != 2 {
		ts.Fatalf("usage: json [-len] PATH WANT")
	}
	err := jsonCheck(ts.ReadFile("stdout"), args[0], args[1], byLen)
	switch {
	case err != nil && !neg:
		ts.Fatalf("%v", err)
	case err == nil && neg:
		ts.Fatalf("stdout holds %s = %s", args[0], args[1])
	}
}

// jsonCheck checks that the value at path in the JSON document doc is want
// or, with byLen, has want elements.
func jsonCheck(doc, path, want string, byLen bool) error {
	var root any
	if err := json.Unmarshal([]byte(doc), &root); err != nil {
		return fmt.Errorf("stdout is not one JSON value: %v", err)
	}
	got, err := jsonAt(root, path)
	if err != nil {
		return err
	}
	if byLen {
		n := -1
		switch v := got.(type) {
		case []any:
			n = len(v)
		case map[string]any:
			n = len(v)
		case string:
			n = len(v)
		}
		if strconv.Itoa(n) != want {
			return fmt.Errorf("%s has %d elements, want %s", path, n, want)
		}
		return nil
	}
	if !jsonEqual(got, want) {
		g, _ := json.Marshal(got)
		return fmt.Errorf("%s = %s, want %s", path, g, want)
	}
	return nil
}

// jsonAt returns the value at path in v. A path is "." for v itself, or a
// chain of steps: ".name" (an object's field), ".[3]" (an array's element)
// or ".[key=value]" (the first element of an array whose field key is
// value), e.g. ".[id=rl-1234abcd].draining" or ".relay.hostname".
func jsonAt(v any, path string) (any, error) {
	if path == "." {
		return v, nil
	}
	rest := path
	for rest != "" {
		if rest[0] != '.' {
			return nil, fmt.Errorf("path %q: steps start with '.'", path)
		}
		rest = rest[1:]
		var step string
		if strings.HasPrefix(rest, "[") {
			end := strings.Index(rest, "]")
			if end < 0 {
				return nil, fmt.Errorf("path %q: unclosed [", path)
			}
			step, rest = rest[:end+1], rest[end+1:]
		} else {
			end := strings.IndexAny(rest, ".[")
			if end < 0 {
				end = len(rest)
			}
			step, rest = rest[:end], rest[end:]
		}
		next, err := jsonStep(v, step)
		if err != nil {
			return nil, fmt.Errorf("path %q: %w", path, err)
		}
		v = next
	}
	return v, nil
}

func jsonStep(v any, step string) (any, error) {
	if !strings.HasPrefix(step, "[") {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: not an object", step)
		}
		field, ok := obj[step]
		if !ok {
			return nil, fmt.Errorf("no field %q", step)
		}
		return field, nil
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s: not an array", step)
	}
	inner := step[1 : len(step)-1]
	key, want, isSelector := strings.Cut(inner, "=")
	if !isSelector {
		i, err := strconv.Atoi(inner)
		if err != nil || i < 0 || i >= len(arr) {
			return nil, fmt.Errorf("%s: no such element of %d", step, len(arr))
		}
		return arr[i], nil
	}
	for _, el := range arr {
		if obj, ok := el.(map[string]any); ok && jsonEqual(obj[key], want) {
			return el, nil
		}
	}
	return nil, fmt.Errorf("%s: no such element", step)
}

// jsonEqual reports whether got is want, read as JSON when it is JSON (true,
// 3, "x", [...]) and as a bare string otherwise.
func jsonEqual(got any, want string) bool {
	var w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		w = want
	}
	return reflect.DeepEqual(got, w)
}

func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exitcode CODE PROGRAM ARGS...")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		got = exitErr.ExitCode()
	case err != nil:
		ts.Fatalf("exitcode: %v", err)
	}
	if got != want {
		ts.Fatalf("%s exited with %d, want %d", args[1], got, want)
	}
}
