package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// run builds what it needs, measures direct, then every protocol through
// its own relay and agent, and reports.
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

// measureTargets measures direct and every protocol into rep and returns how
// many targets had failures; the error is ctx's when the run was interrupted.
func measureTargets(ctx context.Context, cfg *config, o fleetOpts, rep *report, logf func(string, ...any)) (int, error) {
	failures := 0
	logf("measuring direct to the backend at %s", o.backendURL)
	direct, err := measureAll(ctx, cfg, target{name: "direct", base: o.backendURL, backend: o.backend}, logf)
	if ctx.Err() != nil {
		return failures, ctx.Err()
	}
	if err != nil {
		logf("direct: %v\nbackend log:\n%s", err, o.backend.logTail(10))
		failures++
	}
	rep.add("direct", direct)
	for _, p := range cfg.Protocols {
		o.protocol = p
		res, started, err := measureProtocol(ctx, cfg, o, logf)
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
		}
		if started {
			rep.add(p, res)
		} else {
			rep.skip(p, "the relay or the agent did not start: see the log above")
		}
	}
	for _, p := range cfg.Peers {
		res, started, err := measurePeer(ctx, cfg, o, p, logf)
		switch {
		case ctx.Err() != nil:
			return failures, ctx.Err()
		case err != nil:
			logf("peer %q: %v", p.name, err)
			failures++
		}
		if started {
			rep.addPeer(p.name, res)
		} else {
			rep.skip(p.name, "the peer's server or client did not start: see the log above")
		}
	}
	return failures, nil
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

// measureProtocol starts a relay and an agent speaking protocol, measures
// through them and stops them. started reports whether both came up.
func measureProtocol(ctx context.Context, cfg *config, o fleetOpts, logf func(string, ...any)) (res results, started bool, err error) {
	start := startFleet
	if o.protocol == floorProtocol {
		logf("starting two TCP forwarders (the floor)")
		start = startFloor
	} else {
		logf("starting a relay and a %s agent", o.protocol)
	}
	f, err := start(ctx, o)
	if err != nil {
		return results{}, false, err
	}
	defer f.stop()
	t := target{name: o.protocol, base: f.deviceURL(), relay: f.relay, holder: f.holder, agent: f.agent, relayURL: f.relayURL, backend: o.backend}
	if o.protocol == floorProtocol {
		t.relayURL = "" // a forwarder has no /healthz of its own
	}
	res, err = measureAll(ctx, cfg, t, logf)
	if o.protocol == floorProtocol {
		return res, true, err
	}
	res.ProtocolsSeen = f.protocolsSeen()
	if err != nil {
		err = fmt.Errorf("%w\nrelay log:\n%s\nagent log:\n%s\nbackend log:\n%s", err, f.relay.logTail(10), f.agent.logTail(10), o.backend.logTail(10))
	}
	if !slices.Equal(res.ProtocolsSeen, []string{o.protocol}) {
		logf("warning: asked for protocol %q, the agent's log shows %q", o.protocol, res.ProtocolsSeen)
	}
	return res, true, err
}
