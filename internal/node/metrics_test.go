package node_test

import (
	"bufio"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// metricName is the shape of every Switchboard metric:
// switchboard_<subsystem>_<name>, the subsystem the component that counts
// (a new component's metrics add it here and in docs/metrics.md).
var (
	metricName = regexp.MustCompile(`^switchboard_[a-z]+_[a-z_]+$`)
	subsystem  = regexp.MustCompile(`^switchboard_(broker|tunnel|limit|fleet|router|forward|watchdog|topic|tcp)_`)
)

// TestMetricNames scrapes a relay's /metrics and holds every metric it
// registers to the naming rule and to docs/metrics.md, so that a metric
// cannot be added, or renamed, without the page operators read.
func TestMetricNames(t *testing.T) {
	n := startNode(t)
	resp, err := http.Get("http://" + n.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		// "# TYPE name kind" names each metric once, histograms by their base name.
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names = append(names, f[2])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("scraped only %d metrics: %v", len(names), names)
	}
	for _, name := range names {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue // the Go runtime's and the process's own
		}
		if !metricName.MatchString(name) || !subsystem.MatchString(name) {
			t.Errorf("metric %s is not named switchboard_<subsystem>_<name>", name)
		}
		if !regexp.MustCompile("`" + name + "[`{]").Match(doc) {
			t.Errorf("metric %s is not documented in docs/metrics.md", name)
		}
	}
}
