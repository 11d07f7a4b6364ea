package test

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// manifest is what one chart rendering produced, decoded into the
// Kubernetes API types.
type manifest struct {
	statefulSets    []*appsv1.StatefulSet
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	secrets         []*corev1.Secret
	configMaps      []*corev1.ConfigMap
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	networkPolicies []*networkingv1.NetworkPolicy
	ingresses       []*networkingv1.Ingress
	httpRoutes      []*gatewayv1.HTTPRoute
	podMonitors     []*monitoringv1.PodMonitor
	rules           []*monitoringv1.PrometheusRule
}

// namespace is the namespace every rendering is made for.
const namespace = "fleet"

// render runs 'helm lint --strict' and 'helm template' on chart with the
// values file, and decodes every object strictly: a field the API types do
// not have (a typo, a wrong indentation) fails the test.
func render(t *testing.T, chart, values string, set ...string) *manifest {
	t.Helper()
	helm := tool(t, "helm", "SWITCHBOARD_HELM")
	dir := deployPath(t, "helm", chart)
	args := []string{"-f", values}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	run(t, helm, append([]string{"lint", "--strict", dir}, args...)...)
	out := run(t, helm, append([]string{"template", "rel", dir, "--namespace", namespace}, args...)...)
	m := &manifest{}
	for i, doc := range splitDocuments(out) {
		if err := m.add(doc); err != nil {
			t.Fatalf("%s with %s, document %d: %v\n%s", chart, filepath.Base(values), i, err, doc)
		}
	}
	return m
}

// splitDocuments splits a multi-document YAML stream, dropping empty ones.
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// add decodes doc strictly into the type its apiVersion and kind name.
func (m *manifest) add(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	switch gvk := tm.APIVersion + " " + tm.Kind; gvk {
	case "apps/v1 StatefulSet":
		return decode(doc, &m.statefulSets)
	case "apps/v1 Deployment":
		return decode(doc, &m.deployments)
	case "v1 Service":
		return decode(doc, &m.services)
	case "v1 Secret":
		return decode(doc, &m.secrets)
	case "v1 ConfigMap":
		return decode(doc, &m.configMaps)
	case "policy/v1 PodDisruptionBudget":
		return decode(doc, &m.pdbs)
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return decode(doc, &m.hpas)
	case "networking.k8s.io/v1 NetworkPolicy":
		return decode(doc, &m.networkPolicies)
	case "networking.k8s.io/v1 Ingress":
		return decode(doc, &m.ingresses)
	case "gateway.networking.k8s.io/v1 HTTPRoute":
		return decode(doc, &m.httpRoutes)
	case "monitoring.coreos.com/v1 PodMonitor":
		return decode(doc, &m.podMonitors)
	case "monitoring.coreos.com/v1 PrometheusRule":
		return decode(doc, &m.rules)
	default:
		return fmt.Errorf("an object of %q: not a kind this test knows; add it", gvk)
	}
}

func decode[T any](doc []byte, into *[]*T) error {
	v := new(T)
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return fmt.Errorf("strict decoding: %w", err)
	}
	*into = append(*into, v)
	return nil
}

// secret returns the rendered Secret named name, or nil.
func (m *manifest) secret(name string) *corev1.Secret {
	for _, s := range m.secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// flag returns the value of --name=value in args, and whether it is there.
func flag(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name {
			return "", true
		}
	}
	return "", false
}

func containsBytes(haystack []byte, needles ...string) bool {
	for _, n := range needles {
		if !bytes.Contains(haystack, []byte(n)) {
			return false
		}
	}
	return true
}
