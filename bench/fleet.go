package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// errProtocolRefused is returned by startFleet when the agent exits with a
// usage error, which is how it refuses a protocol it does not speak.
var errProtocolRefused = errors.New("the agent refused the protocol")

// fleet is one relay process and one agent process for a protocol; with
// -forwarded, a second relay that holds the device, whose requests relay
// forwards to it.
type fleet struct {
	relay, agent *proc
	relayURL     string // public base URL
	floor        bool   // two TCP forwarders, not a relay and an agent
	holder       *proc  // -forwarded: the relay holding the device
	holderURL    string
	nats         *store.Store // -forwarded: the relays' NATS server
}

// fleetOpts says what startFleet needs to know.
type fleetOpts struct {
	bin        string
	dir        string // temp dir for data and logs
	protocol   string
	backendURL string
	backend    *proc // the backend process, shared by every target
	cfg        *config
}

// startFleet starts a relay and an agent serving the backend as the device,
// and waits until a request through the relay reaches the backend.
func startFleet(ctx context.Context, o fleetOpts) (*fleet, error) {
	f := &fleet{}
	if o.cfg.Forwarded {
		return f, f.startForwarded(ctx, o)
	}
	if err := f.startRelay(ctx, o); err != nil {
		f.stop()
		return nil, err
	}
	if err := f.startAgent(ctx, o); err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

func (f *fleet) startRelay(ctx context.Context, o fleetOpts) error {
	listen, err := freePort()
	if err != nil {
		return err
	}
	admin, err := freePort()
	if err != nil {
		return err
	}
	args := append([]string{"serve",
		"--listen", listen, "--admin-listen", admin,
		"--data", filepath.Join(o.dir, "relay-"+o.protocol),
		"--allow-anonymous-users", "--allow-anonymous-agents",
		"--drain-timeout", "2s", "--log-level", "warn",
	}, o.cfg.RelayFlags...)
	f.relay, err = startProc("relay", o.bin, args, childEnv(o, "relay"), filepath.Join(o.dir, "relay-"+o.protocol+".log"))
	if err != nil {
		return err
	}
	f.relayURL = "http://" + listen
	return waitReady(ctx, f.relay, f.relayURL+"/healthz", 20*time.Second)
}

func (f *fleet) startAgent(ctx context.Context, o fleetOpts) error {
	protocol, protocolFlags := agentProtocol(o.protocol)
	args := append([]string{"agent",
		"--relay", f.relayURL, "--device", device, "--backend", o.backendURL,
		"--protocol", protocol,
		"--num-pending-requests", strconv.Itoa(o.cfg.Pending),
		"--log-level", "info", "--log-format", "text", // connection changes only; protocolsSeen reads them
	}, protocolFlags...)
	args = append(args, o.cfg.AgentFlags...)
	var err error
	f.agent, err = startProc("agent", o.bin, args, childEnv(o, "agent"), filepath.Join(o.dir, "agent-"+o.protocol+".log"))
	if err != nil {
		return err
	}
	err = waitReady(ctx, f.agent, f.deviceURL()+"/small", 20*time.Second)
	if errors.Is(err, errExited) && f.agent.exitCode() == 2 {
		return fmt.Errorf("%w: %w", errProtocolRefused, err)
	}
	return err
}

// deviceURL is the base URL of the device through the relay; the floor's
// forwarders pass paths through unchanged.
func (f *fleet) deviceURL() string {
	if f.floor {
		return f.relayURL
	}
	return f.relayURL + "/client/" + device
}

// stop stops the agent, then the relays and their NATS server.
func (f *fleet) stop() {
	if f.agent != nil {
		f.agent.stop()
	}
	if f.relay != nil {
		f.relay.stop()
	}
	if f.holder != nil {
		f.holder.stop()
	}
	if f.nats != nil {
		f.nats.Close()
	}
}

// startForwarded starts, on one NATS server hosted here, the relay that
// holds the device (region "held", where the agent connects) and the relay
// the load goes to (region "entry"), which forwards every request to it:
// the ranking places a device in the region of the relay its agent
// reached, so the agent stays on the holder.
func (f *fleet) startForwarded(ctx context.Context, o fleetOpts) error {
	st, err := store.Open(ctx, store.Config{DataDir: filepath.Join(o.dir, "nats-"+o.protocol), Listen: "127.0.0.1:0"})
	if err != nil {
		return fmt.Errorf("start NATS: %w", err)
	}
	f.nats = st
	start := func(role, region string) (*proc, string, error) {
		listen, err := freePort()
		if err != nil {
			return nil, "", err
		}
		admin, err := freePort()
		if err != nil {
			return nil, "", err
		}
		url := "http://" + listen
		args := append([]string{"serve",
			"--listen", listen, "--admin-listen", admin, "--advertise", url,
			"--nats", st.ClientURL(), "--region", region,
			"--data", filepath.Join(o.dir, role+"-"+o.protocol),
			"--admin-token-file", filepath.Join(o.dir, "admin-"+o.protocol+".token"),
			"--allow-anonymous-users", "--allow-anonymous-agents",
			"--drain-timeout", "2s", "--log-level", "warn",
		}, o.cfg.RelayFlags...)
		p, err := startProc(role, o.bin, args, childEnv(o, role), filepath.Join(o.dir, role+"-"+o.protocol+".log"))
		if err != nil {
			return nil, "", err
		}
		return p, url, waitReady(ctx, p, url+"/healthz", 20*time.Second)
	}
	if f.holder, f.holderURL, err = start("holder", "held"); err != nil {
		f.stop()
		return err
	}
	if f.relay, f.relayURL, err = start("relay", "entry"); err != nil {
		f.stop()
		return err
	}
	// The agent connects to the holder; users' requests go to the other.
	entry := f.relayURL
	f.relayURL = f.holderURL
	err = f.startAgent(ctx, o)
	f.relayURL = entry
	if err == nil {
		err = waitReady(ctx, f.agent, f.deviceURL()+"/small", 20*time.Second)
	}
	if err != nil {
		f.stop()
	}
	return err
}

// protocolsSeen returns the protocols the agent's log says it connected
// with ("protocol=NAME" in its text log), in order of first appearance. An
// agent may fall back to another protocol than the one asked for; a native
// connection whose line says "tunnel_version=1" counts as native1.
func (f *fleet) protocolsSeen() []string {
	b, err := os.ReadFile(f.agent.logPath)
	if err != nil {
		return nil
	}
	var seen []string
	for line := range strings.Lines(string(b)) {
		name, version := "", ""
		for _, field := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(field, "protocol="); ok {
				name = v
			}
			if v, ok := strings.CutPrefix(field, logkey.TunnelVersion+"="); ok {
				version = v
			}
		}
		if name == "native" && version == "1" {
			name = nativeV1Protocol
		}
		if name != "" && !slices.Contains(seen, name) {
			seen = append(seen, name)
		}
	}
	return seen
}

// childEnv is the environment added for a process: -child-env, and the CPU
// profile file when profiling.
func childEnv(o fleetOpts, role string) []string {
	env := slices.Clone(o.cfg.ChildEnv)
	if o.cfg.ProfileDir != "" {
		env = append(env, "SWITCHBOARD_CPUPROFILE="+filepath.Join(o.cfg.ProfileDir, role+"-"+o.protocol+".pprof"))
	}
	return env
}

// makeTempDir creates the run's temp dir; the returned function removes it
// unless keep is set.
func makeTempDir(keep bool, log func(string, ...any)) (string, func(), error) {
	dir, err := os.MkdirTemp("", "switchboard-bench-")
	if err != nil {
		return "", nil, fmt.Errorf("temp dir: %w", err)
	}
	return dir, func() {
		if keep {
			log("kept %s (binary, relay data, process logs)", dir)
			return
		}
		os.RemoveAll(dir)
	}, nil
}
