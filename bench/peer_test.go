package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParsePeer(t *testing.T) {
	p, err := parsePeer("chisel-1.11=/opt/chisel")
	if err != nil {
		t.Fatal(err)
	}
	if p.name != "chisel-1.11" || p.kind != "chisel" || p.path != "/opt/chisel" {
		t.Errorf("parsePeer = %+v", p)
	}
	if _, err := parsePeer("ngrok=/opt/ngrok"); !errors.Is(err, errUnknownPeer) {
		t.Errorf("unknown kind: err = %v, want errUnknownPeer", err)
	}
	for _, bad := range []string{"chisel", "=/opt/chisel", "chisel="} {
		if _, err := parsePeer(bad); err == nil {
			t.Errorf("parsePeer(%q) took it", bad)
		}
	}
}

// TestProtocolsSeenTunnelVersion checks that a native agent's log line with
// tunnel version 1 counts as native1, and one with version 2 as native.
func TestProtocolsSeenTunnelVersion(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "agent.log")
	lines := "time=x level=INFO msg=connected protocol=native tunnel_version=2\n" +
		"time=x level=INFO msg=connected protocol=native tunnel_version=1\n" +
		"time=x level=INFO msg=connected protocol=longpoll\n"
	if err := os.WriteFile(log, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &fleet{agent: &proc{logPath: log}}
	if got, want := f.protocolsSeen(), []string{"native", "native1", "longpoll"}; !slices.Equal(got, want) {
		t.Errorf("protocolsSeen = %q, want %q", got, want)
	}
	if p, flags := agentProtocol(nativeV1Protocol); p != "native" || !slices.Equal(flags, []string{"--tunnel-version", "1"}) {
		t.Errorf("agentProtocol(native1) = %q %q", p, flags)
	}
}
