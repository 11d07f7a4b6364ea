// Package internal_test checks the layering of Switchboard's packages: each
// may import only packages of layers below its own, so that policy and
// protocol never depend on the parts that wire them together.
package internal_test

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/switchboard-relay/switchboard/internal/"

// layers lists the internal packages from the bottom up. A package may
// import packages of lower layers only; a new package must be placed here.
var layers = [][]string{
	// What every component shares: how its configuration and its HTTP
	// errors are told.
	{"config", "httperr", "logkey"},
	// How often a hot path logs.
	{"lograte"},
	// Pure policy, protocol and plumbing: nothing below but the shared.
	{"backoff", "ranking", "secret", "wire", "mux", "service", "datagram", "proxyproto", "sni", "tcpconns", "limit", "watchdog", "store", "kvmirror", "tlsconf", "testkit", "natscluster", "tlsconf/tlstest", "tunnel/livenesstest"},
	// State and the halves of the protocols; replay reads the errors of
	// the HTTP libraries and of mux; flows carries UDP flows over streams;
	// splice joins connections with mux's idle-free copies.
	{"auth", "peer", "broker", "fleet", "replay", "flows", "splice"},
	// h1 is the relay's HTTP/1.1 client over mux streams.
	{"h1"},
	{"access", "longpoll", "tunnel", "auth/authtest", "fleetsecret", "topic", "connect"},
	// The fleet's mapped ports: their state, and listeners that open
	// connections through connect's Opener; the operator API manages them.
	{"ports"},
	// Users' requests forwarded to a device's holder as streams: connect's
	// sessions between relays, spliced onto the tunnel's streams; and the
	// watchdogs' pulses, upgraded as connect's are.
	{"forward", "pulse"},
	// The parts a relay and an agent are made of.
	{"relay", "router", "agent", "control"},
	// One relay, wired.
	{"node"},
	// The command line and the in-process fleet of the tests.
	{"cli", "fleettest"},
}

func TestLayering(t *testing.T) {
	layerOf := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			layerOf[p] = i
		}
	}
	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || path == "." || d.Name() == "testdata" {
			return err
		}
		pkg, err := build.ImportDir(path, 0)
		if err != nil {
			if _, none := err.(*build.NoGoError); none {
				return nil
			}
			return err
		}
		name := filepath.ToSlash(path)
		seen[name] = true
		mine, ok := layerOf[name]
		if !ok {
			t.Errorf("internal/%s is in no layer: place it in layers", name)
			return nil
		}
		for _, imp := range pkg.Imports {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			if theirs, ok := layerOf[dep]; !ok || theirs >= mine {
				t.Errorf("internal/%s (layer %d) imports internal/%s (layer %d): a package may import only layers below its own", name, mine, dep, theirs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range layerOf {
		if !seen[name] {
			t.Errorf("layers names internal/%s, which has no Go files", name)
		}
	}
}
