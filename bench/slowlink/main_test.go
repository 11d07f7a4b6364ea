package main

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
)

// toxiproxyBinary is the toxiproxy-server the test runs: from
// SWITCHBOARD_TOXIPROXY, else on PATH. Without one the test is skipped,
// unless SWITCHBOARD_REQUIRE_TOXIPROXY is set (as CI does).
func toxiproxyBinary(t *testing.T) string {
	if p := os.Getenv("SWITCHBOARD_TOXIPROXY"); p != "" {
		return p
	}
	if p, err := exec.LookPath("toxiproxy-server"); err == nil {
		return p
	}
	if os.Getenv("SWITCHBOARD_REQUIRE_TOXIPROXY") != "" {
		t.Fatal("SWITCHBOARD_REQUIRE_TOXIPROXY is set but there is no toxiproxy: set SWITCHBOARD_TOXIPROXY to its server's path")
	}
	t.Skip("no toxiproxy-server (set SWITCHBOARD_TOXIPROXY): go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0")
	return ""
}

// The harness runs end to end through a real toxiproxy, on a short link
// and a small download: every path answers its GETs and delivers every
// byte, over both tunnel versions. The figures are the benchmark's to
// report, not the test's to judge.
func TestSlowLink(t *testing.T) {
	t.Parallel()
	bin, err := benchkit.SharedBinary()
	if err != nil {
		t.Fatal(err)
	}
	o := options{
		toxiproxy:  toxiproxyBinary(t),
		bin:        bin,
		latency:    5 * time.Millisecond,
		rateKBps:   50_000,
		downloadMB: 5,
		requests:   3,
		versions:   []int{2, 1},
	}
	results, err := run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1+len(o.versions) {
		t.Fatalf("%d paths measured, want %d", len(results), 1+len(o.versions))
	}
	for _, r := range results {
		if r.getP50 <= 0 || r.download <= 0 {
			t.Errorf("%s: no figures: %+v", r.name, r)
		}
		t.Logf("%s: GET p50 %v, download %.1f MB/s", r.name, r.getP50, r.download)
	}
}
