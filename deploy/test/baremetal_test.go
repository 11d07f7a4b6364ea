package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnits: systemd-analyze verify accepts the units as they are
// installed (the binary at the path they name), with no warning at all: a
// misspelt hardening directive is only a warning, and would silently
// harden nothing.
func TestSystemdUnits(t *testing.T) {
	analyze := tool(t, "systemd-analyze", "SWITCHBOARD_SYSTEMD_ANALYZE")
	bin := switchboard(t)
	dir := t.TempDir()
	units, err := filepath.Glob(deployPath(t, "systemd", "*.service"))
	if err != nil || len(units) == 0 {
		t.Fatalf("no units in deploy/systemd: %v", err)
	}
	for _, unit := range units {
		b, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "ExecStart=/usr/local/bin/switchboard ") {
			t.Fatalf("%s does not start /usr/local/bin/switchboard", filepath.Base(unit))
		}
		// The unit as installed, with the binary where it says.
		installed := strings.ReplaceAll(string(b), "/usr/local/bin/switchboard", bin)
		name := filepath.Base(unit)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(installed), 0o644); err != nil {
			t.Fatal(err)
		}
		instance := strings.Replace(name, "@.service", "@demo.service", 1)
		cmd := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, instance))
		out, err := cmd.CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
	}
}

// TestHAProxyConfig: HAProxy accepts the example in front of the relays.
func TestHAProxyConfig(t *testing.T) {
	haproxy := tool(t, "haproxy", "SWITCHBOARD_HAPROXY")
	out, err := exec.Command(haproxy, "-c", "-f", deployPath(t, "bare-metal", "haproxy.cfg")).CombinedOutput()
	if err != nil || strings.Contains(string(out), "WARNING") {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}
