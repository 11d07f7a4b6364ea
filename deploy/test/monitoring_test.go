package test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

var adminTokenPattern = regexp.MustCompile(`^sbx_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$`)

func metav1LabelSelector(s *metav1.LabelSelector) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(s)
}

// alertsFile and dashboardFile are the monitoring files the chart ships.
func alertsFile(t *testing.T) string {
	return deployPath(t, "helm", "switchboard", "files", "alerts.yaml")
}

func dashboardFile(t *testing.T) string {
	return deployPath(t, "helm", "switchboard", "files", "dashboard.json")
}

// ruleFile is the part of a Prometheus rule file this test reads.
type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert string `json:"alert"`
			Expr  string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(alertsFile(t))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil { // promtool checks it strictly
		t.Fatalf("alerts.yaml: %v", err)
	}
	return rf
}

func alertNames(t *testing.T) []string {
	var names []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	return names
}

// TestAlertRules: promtool accepts the alerts, and they are the alerts an
// operator of a fleet needs.
func TestAlertRules(t *testing.T) {
	promtool := tool(t, "promtool", "SWITCHBOARD_PROMTOOL")
	out := run(t, promtool, "check", "rules", alertsFile(t))
	if !containsBytes(out, "SUCCESS") {
		t.Fatalf("promtool check rules:\n%s", out)
	}
	names := alertNames(t)
	for _, want := range []string{"SwitchboardFailover", "SwitchboardFleetSecretSplit", "SwitchboardRelayStale", "SwitchboardNATSDisconnected", "SwitchboardDevicesLost"} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s among %v", want, names)
		}
	}
}

// metricNames returns the switchboard_ metrics the alerts and the dashboard
// query, histograms by their base name.
func metricNames(t *testing.T) []string {
	t.Helper()
	var exprs []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	b, err := os.ReadFile(dashboardFile(t))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q queries nothing", p.Title)
		}
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, m := range regexp.MustCompile(`switchboard_[a-z0-9_]+`).FindAllString(e, -1) {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if base, ok := strings.CutSuffix(m, suffix); ok && strings.HasSuffix(base, "_seconds") {
					m = base
				}
			}
			seen[m] = true
		}
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
