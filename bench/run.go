package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// run builds what it needs, starts direct, every protocol through its own
// relay and agent and every peer, measures them all (see measureRounds),
// and reports.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }
	dir, cleanup, err := makeTempDir(cfg.Keep, logf)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := prepareProfileDir(&cfg); err != nil {
		return err
	}
	bin, err := binary(ctx, &cfg, dir, logf)
	if err != nil {
		return err
	}
	logf("starting the backend process")
	be, err := startBackend(ctx, &cfg, dir)
	if err != nil {
		return err
	}
	defer be.Close()
	rep := newReport(&cfg)
	failures, err := measureTargets(ctx, &cfg, fleetOpts{bin: bin, dir: dir, backendURL: be.URL(), backend: be.p, cfg: &cfg}, rep, logf)
	if err != nil {
		return err
	}
	if err := rep.write(stdout, cfg.Markdown); err != nil {
		return err
	}
	if failures > 0 {
		return fmt.Errorf("%d of %d targets had failures, logged above", failures, 1+len(cfg.Protocols)+len(cfg.Peers))
	}
	return nil
}

// measureTargets starts direct, every protocol and every peer, measures
// them into rep (see measureRounds) and returns how many targets had
// failures; the error is ctx's when the run was interrupted.
func measureTargets(ctx context.Context, cfg *config, o fleetOpts, rep *report, logf func(string, ...any)) (int, error) {
	failures := 0
	targets := []*live{{name: "direct", t: target{name: "direct", base: o.backendURL, backend: o.backend},
		logs: func() string { return "backend log:\n" + o.backend.logTail(10) }}}
	defer func() {
		for _, l := range slices.Backward(targets) {
			if l.stop != nil {
				l.stop()
			}
		}
	}()
	for _, p := range cfg.Protocols {
		o.protocol = p
		l, err := startProtocol(ctx, o, logf)
		switch {
		case ctx.Err() != nil:
			return failures, ctx.Err()
		case errors.Is(err, errProtocolRefused):
			logf("skipping protocol %q: %v", p, err)
			rep.skip(p, "the agent does not speak it")
			continue
		case err != nil:
			logf("protocol %q: %v", p, err)
			failures++
			rep.skip(p, "the relay or the agent did not start: see the log above")
			continue
		}
		targets = append(targets, l)
	}
	for _, p := range cfg.Peers {
		l, err := startPeerTarget(ctx, o, p, logf)
		switch {
		case ctx.Err() != nil:
			return failures, ctx.Err()
		case err != nil:
			logf("peer %q: %v", p.name, err)
			failures++
			rep.skip(p.name, "the peer's server or client did not start: see the log above")
			continue
		}
		targets = append(targets, l)
	}
	measureRounds(ctx, cfg, targets, logf)
	if ctx.Err() != nil {
		return failures, ctx.Err()
	}
	for _, l := range targets {
		if err := errors.Join(l.errs...); err != nil {
			logf("%s: %v\n%s", l.name, err, l.logs())
			failures++
		}
		if l.seen != nil {
			l.res.ProtocolsSeen = l.seen()
			if !slices.Equal(l.res.ProtocolsSeen, []string{l.name}) {
				logf("warning: asked for protocol %q, the agent's log shows %q", l.name, l.res.ProtocolsSeen)
			}
		}
		if l.peer {
			rep.addPeer(l.name, l.res)
		} else {
			rep.add(l.name, l.res)
		}
	}
	return failures, nil
}

// live is a target started for the run, and what was measured through it.
type live struct {
	name string
	peer bool
	t    target
	res  results
	errs []error
	c    *http.Client // the target's, for all its measurements
	// stop stops its processes; logs returns their last lines, for a
	// failure; seen, for a relay and an agent, the protocols the agent's
	// log says it connected with.
	stop func()
	logs func() string
	seen func() []string
}

// measureRounds runs the measurements of cfg.Tests against every target,
// all of them running throughout. The latency, request-rate and websocket
// tests run in cfg.Rounds rounds, each target's share of the test (a
// round's part of its requests, its duration, its echoes) in turn in
// each round, so that what drifts on the machine over the run (a
// neighbour's load, the clock's frequency) falls on every target alike,
// not on whichever was measured last; the others run once per target. A
// measurement that fails is recorded in the target's results and not run
// again; the next one runs.
func measureRounds(ctx context.Context, cfg *config, targets []*live, logf func(string, ...any)) {
	for _, l := range targets {
		l.res.Failed = map[string]bool{}
		l.c = newClient(cfg.Concurrency)
		defer l.c.CloseIdleConnections()
	}
	for _, s := range steps {
		if !slices.Contains(cfg.Tests, s.name) {
			continue
		}
		rounds, share := 1, *cfg
		if s.name == testLatency || s.name == testRPS || s.name == testWS {
			rounds = cfg.Rounds
			share.N, share.WSRoundTrips = cfg.N/rounds, cfg.WSRoundTrips/rounds
			share.Duration = cfg.Duration / time.Duration(rounds)
		}
		for round := range rounds {
			for _, l := range targets {
				if l.res.Failed[s.name] {
					continue
				}
				if rounds > 1 {
					logf("%s: %s, round %d of %d", l.name, s.name, round+1, rounds)
				} else {
					logf("%s: %s", l.name, s.name)
				}
				if err := s.run(ctx, env{cfg: &share, c: l.c, t: l.t}, &l.res); err != nil {
					l.res.Failed[s.name] = true
					l.errs = append(l.errs, fmt.Errorf("%s %s: %w", l.name, s.name, err))
					if ctx.Err() != nil {
						return
					}
				}
			}
		}
	}
}

// binary returns the switchboard binary to run, building it unless -bin names one.
func binary(ctx context.Context, cfg *config, dir string, logf func(string, ...any)) (string, error) {
	if cfg.Bin != "" {
		return cfg.Bin, nil
	}
	logf("building switchboard (release build, profiled=%v)", cfg.ProfileDir != "")
	return buildBinary(ctx, dir, cfg.ProfileDir != "")
}

// prepareProfileDir creates the profile dir and makes its path absolute.
func prepareProfileDir(cfg *config) error {
	if cfg.ProfileDir == "" {
		return nil
	}
	abs, err := filepath.Abs(cfg.ProfileDir)
	if err != nil {
		return fmt.Errorf("profile dir: %w", err)
	}
	cfg.ProfileDir = abs
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return fmt.Errorf("profile dir: %w", err)
	}
	return nil
}

// startProtocol starts a relay and an agent speaking o.protocol, or the
// floor's two forwarders.
func startProtocol(ctx context.Context, o fleetOpts, logf func(string, ...any)) (*live, error) {
	start := startFleet
	if o.protocol == floorProtocol {
		logf("starting two TCP forwarders (the floor)")
		start = startFloor
	} else {
		logf("starting a relay and a %s agent", o.protocol)
	}
	f, err := start(ctx, o)
	if err != nil {
		return nil, err
	}
	l := &live{name: o.protocol, stop: f.stop,
		t: target{name: o.protocol, base: f.deviceURL(), relay: f.relay, holder: f.holder, agent: f.agent, relayURL: f.relayURL, backend: o.backend}}
	l.logs = func() string {
		return fmt.Sprintf("relay log:\n%s\nagent log:\n%s\nbackend log:\n%s", f.relay.logTail(10), f.agent.logTail(10), o.backend.logTail(10))
	}
	if o.protocol == floorProtocol {
		l.t.relayURL = "" // a forwarder has no /healthz of its own
	} else {
		l.seen = f.protocolsSeen
	}
	return l, nil
}
