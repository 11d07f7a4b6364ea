package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// nativeV1Protocol is the pseudo-protocol "native1": the native agent held
// to tunnel version 1 (--protocol native --tunnel-version 1), so that one
// run measures both tunnel versions; "native" is the agent's default.
const nativeV1Protocol = "native1"

// agentProtocol returns the agent's --protocol for a protocol of -protocols
// and the flags that go with it.
func agentProtocol(protocol string) (string, []string) {
	if protocol == nativeV1Protocol {
		return "native", []string{"--tunnel-version", "1"}
	}
	return protocol, nil
}

// peer is another relay measured on the same path: a server process in the
// relay's place and a client process in the agent's, started from binaries
// built elsewhere (the harness never builds one).
type peer struct {
	name string // the column's name, as given to -peer
	kind string // chisel or frp, from the name
	path string // chisel's binary; frp's directory holding frps and frpc
}

// peerKinds are the peers the harness knows how to start.
var peerKinds = []string{"chisel", "frp"}

// errUnknownPeer marks a -peer whose name starts with no known kind.
var errUnknownPeer = errors.New("unknown peer")

// parsePeer parses -peer NAME=PATH; NAME starts with the peer's kind
// (chisel, chisel-1.11, frp, …).
func parsePeer(s string) (peer, error) {
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return peer{}, fmt.Errorf("-peer %q: want NAME=PATH", s)
	}
	for _, k := range peerKinds {
		if strings.HasPrefix(name, k) {
			abs, err := filepath.Abs(path)
			if err != nil {
				return peer{}, fmt.Errorf("-peer %q: %w", s, err)
			}
			return peer{name: name, kind: k, path: abs}, nil
		}
	}
	return peer{}, fmt.Errorf("-peer %q: %w: the name must start with one of %s", s, errUnknownPeer, strings.Join(peerKinds, ", "))
}

// startPeer starts the peer's server and client so that the server's public
// port reaches the backend through the client, and waits until a small GET
// gets through. Its fleet has no path prefix, like the floor's.
func startPeer(ctx context.Context, o fleetOpts, p peer) (*fleet, error) {
	control, err := freePort()
	if err != nil {
		return nil, err
	}
	public, err := freePort()
	if err != nil {
		return nil, err
	}
	backendAddr := strings.TrimPrefix(o.backendURL, "http://")
	var serverBin, clientBin string
	var serverArgs, clientArgs []string
	switch p.kind {
	case "chisel":
		// Reverse mode: the client dials out, as an agent does, and the
		// server listens for users on the client's behalf.
		host, port, _ := strings.Cut(control, ":")
		serverBin, clientBin = p.path, p.path
		serverArgs = []string{"server", "--host", host, "--port", port, "--reverse"}
		clientArgs = []string{"client", "http://" + control, "R:" + public + ":" + backendAddr}
	case "frp":
		serverBin, clientBin = filepath.Join(p.path, "frps"), filepath.Join(p.path, "frpc")
		sconf, cconf, err := writeFRPConfig(o.dir, p.name, control, public, backendAddr)
		if err != nil {
			return nil, err
		}
		serverArgs = []string{"-c", sconf}
		clientArgs = []string{"-c", cconf}
	}
	f := &fleet{floor: true}
	f.relay, err = startProc("relay", serverBin, serverArgs, childEnv(o, "relay"), filepath.Join(o.dir, "relay-"+p.name+".log"))
	if err != nil {
		return nil, err
	}
	if err := waitListening(ctx, f.relay, control, 20*time.Second); err != nil {
		f.stop()
		return nil, err
	}
	f.agent, err = startProc("agent", clientBin, clientArgs, childEnv(o, "agent"), filepath.Join(o.dir, "agent-"+p.name+".log"))
	if err != nil {
		f.stop()
		return nil, err
	}
	f.relayURL = "http://" + public
	if err := waitReady(ctx, f.agent, f.deviceURL()+"/small", 20*time.Second); err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

// writeFRPConfig writes frps's and frpc's configuration: both on loopback,
// one TCP proxy from public to the backend, frp's defaults otherwise (its
// TCP multiplexing on, no dashboard, no admin server).
func writeFRPConfig(dir, name, control, public, backendAddr string) (server, client string, err error) {
	chost, cport, _ := strings.Cut(control, ":")
	phost, pport, _ := strings.Cut(public, ":")
	bhost, bport, _ := strings.Cut(backendAddr, ":")
	server = filepath.Join(dir, name+"-frps.toml")
	client = filepath.Join(dir, name+"-frpc.toml")
	sconf := fmt.Sprintf("bindAddr = %q\nbindPort = %s\nproxyBindAddr = %q\nlog.level = \"warn\"\n", chost, cport, phost)
	cconf := fmt.Sprintf("serverAddr = %q\nserverPort = %s\nloginFailExit = true\nlog.level = \"warn\"\n\n"+
		"[[proxies]]\nname = \"bench\"\ntype = \"tcp\"\nlocalIP = %q\nlocalPort = %s\nremotePort = %s\n",
		chost, cport, bhost, bport, pport)
	if err := os.WriteFile(server, []byte(sconf), 0o644); err != nil {
		return "", "", fmt.Errorf("frp config: %w", err)
	}
	if err := os.WriteFile(client, []byte(cconf), 0o644); err != nil {
		return "", "", fmt.Errorf("frp config: %w", err)
	}
	return server, client, nil
}

// waitListening dials addr until it accepts a TCP connection, p exits, ctx
// ends or timeout passes: a peer's client may give up on a server not yet
// listening.
func waitListening(ctx context.Context, p *proc, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var d net.Dialer
	for {
		if c, err := d.DialContext(ctx, "tcp", addr); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s: %w (code %d): %v\n%s", p.name, errExited, p.exitCode(), p.err, p.logTail(5))
		case <-ctx.Done():
			return fmt.Errorf("%s: %w: nothing listens on %s after %v\n%s", p.name, errGaveUp, addr, timeout, p.logTail(5))
		case <-tick.C:
		}
	}
}

// startPeerTarget starts the peer's server and client.
func startPeerTarget(ctx context.Context, o fleetOpts, p peer, logf func(string, ...any)) (*live, error) {
	logf("starting the peer %s (%s)", p.name, p.path)
	o.protocol = p.name
	f, err := startPeer(ctx, o, p)
	if err != nil {
		return nil, err
	}
	return &live{name: p.name, peer: true, stop: f.stop,
		t: target{name: p.name, base: f.deviceURL(), relay: f.relay, agent: f.agent, backend: o.backend},
		logs: func() string {
			return fmt.Sprintf("server log:\n%s\nclient log:\n%s", f.relay.logTail(10), f.agent.logTail(10))
		}}, nil
}
