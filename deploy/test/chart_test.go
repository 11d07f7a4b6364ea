package test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// valuesFiles returns the values files of a chart's ci/ folder.
func valuesFiles(t *testing.T, chart string) []string {
	t.Helper()
	files, err := filepath.Glob(deployPath(t, "helm", chart, "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in deploy/helm/%s/ci: %v", chart, err)
	}
	return files
}

// chartValues is the part of a values file the invariants depend on.
type chartValues struct {
	Replicas int `json:"replicas"`
	Admin    struct {
		ExistingSecret string `json:"existingSecret"`
	} `json:"admin"`
	FleetSecret struct {
		ExistingSecret string `json:"existingSecret"`
	} `json:"fleetSecret"`
	NATS struct {
		CredsSecret string `json:"credsSecret"`
		CASecret    string `json:"caSecret"`
	} `json:"nats"`
	TLS struct {
		SecretName string `json:"secretName"`
	} `json:"tls"`
	Autoscaling struct {
		Enabled bool `json:"enabled"`
	} `json:"autoscaling"`
	NetworkPolicy *struct {
		Enabled bool `json:"enabled"`
	} `json:"networkPolicy"`
	TopologySpread *struct {
		Zones bool `json:"zones"`
	} `json:"topologySpread"`
	Monitoring struct {
		PodMonitor     bool `json:"podMonitor"`
		PrometheusRule bool `json:"prometheusRule"`
		Dashboard      bool `json:"dashboard"`
	} `json:"monitoring"`
}

func readValues(t *testing.T, path string) chartValues {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v chartValues
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// TestRelayChart renders the relay chart with each of its values files and
// checks what the fleet depends on: the objects decode strictly, relays keep
// their names, never share a node, drain before they go and are given the
// time to, the probes and ports are those the binary serves with the flags
// the chart gives it, the admin listener stays private, and every secret a
// pod mounts exists.
func TestRelayChart(t *testing.T) {
	for _, file := range valuesFiles(t, "switchboard") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			v := readValues(t, file)
			m := render(t, "switchboard", file)
			if len(m.statefulSets) != 1 {
				t.Fatalf("%d StatefulSets, want 1", len(m.statefulSets))
			}
			ss := m.statefulSets[0]
			c := relayContainer(t, ss)
			checkIdentity(t, ss, c)
			checkPorts(t, c)
			checkDrain(t, ss, c)
			checkPlacement(t, m, ss, v)
			checkHardening(t, ss, c)
			checkSecrets(t, m, ss, v)
			checkServices(t, m, ss, c)
			checkNetworkPolicy(t, m, v)
			checkScaling(t, m, ss, v)
			checkMonitoring(t, m, v)
		})
	}
}

func relayContainer(t *testing.T, ss *appsv1.StatefulSet) *corev1.Container {
	t.Helper()
	for i := range ss.Spec.Template.Spec.Containers {
		if c := &ss.Spec.Template.Spec.Containers[i]; c.Name == "relay" {
			if len(c.Args) == 0 || c.Args[0] != "serve" {
				t.Fatalf("the relay container runs %v, want 'serve …'", c.Args)
			}
			return c
		}
	}
	t.Fatal("no container named relay")
	return nil
}

// checkIdentity: the relay's id comes from the pod's namespace and name,
// which a StatefulSet keeps across restarts.
func checkIdentity(t *testing.T, ss *appsv1.StatefulSet, c *corev1.Container) {
	name, ok := flag(c.Args, "relay-name")
	if !ok || name != "$(POD_NAMESPACE)/$(POD_NAME)" {
		t.Errorf("--relay-name %q, want $(POD_NAMESPACE)/$(POD_NAME): a restarted pod must be the same relay", name)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("POD_NAME and POD_NAMESPACE come from %v, want the pod's metadata", env)
	}
	if ss.Spec.ServiceName == "" {
		t.Error("the StatefulSet names no governing Service: pods get no stable DNS names")
	}
}

// portOf returns the port of a listen address such as ":8080".
func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	p, err := strconv.Atoi(addr[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("listen address %q has no port", addr)
	}
	return int32(p)
}

// checkPorts: the container's ports are those --listen and --admin-listen
// open, and the probes ask the admin listener for /healthz and /readyz.
func checkPorts(t *testing.T, c *corev1.Container) {
	listen, _ := flag(c.Args, "listen")
	admin, _ := flag(c.Args, "admin-listen")
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["public"] != portOf(t, listen) || ports["admin"] != portOf(t, admin) {
		t.Errorf("container ports %v, want public %s and admin %s as the flags open", ports, listen, admin)
	}
	probes := map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
	wantPath := map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}
	for kind, p := range probes {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("no %s probe over HTTP", kind)
			continue
		}
		if p.HTTPGet.Path != wantPath[kind] || p.HTTPGet.Port != intstr.FromString("admin") {
			t.Errorf("%s probe GET %s on %v, want %s on the admin port", kind, p.HTTPGet.Path, p.HTTPGet.Port.String(), wantPath[kind])
		}
	}
}

// checkDrain: the preStop drains the relay through its own admin listener
// and waits for it, and the pod's grace outlasts the drain, so that the
// kubelet's SIGKILL never cuts one short.
func checkDrain(t *testing.T, ss *appsv1.StatefulSet, c *corev1.Container) {
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil {
		t.Fatal("no preStop exec hook: a pod going away would not drain first")
	}
	cmd := c.Lifecycle.PreStop.Exec.Command
	if len(cmd) < 3 || cmd[0] != "/switchboard" || cmd[1] != "ctl" || cmd[2] != "stop" {
		t.Fatalf("preStop runs %v, want /switchboard ctl stop …", cmd)
	}
	admin, _ := flag(c.Args, "admin-listen")
	if url, _ := flag(cmd, "admin"); url != "http://127.0.0.1:"+strconv.Itoa(int(portOf(t, admin))) {
		t.Errorf("preStop asks %q, want this pod's own admin listener %s", url, admin)
	}
	tokenFile, _ := flag(cmd, "token-file")
	if serveToken, _ := flag(c.Args, "admin-token-file"); tokenFile != serveToken || tokenFile == "" {
		t.Errorf("preStop reads the admin token from %q, the relay from %q", tokenFile, serveToken)
	}
	grace := time.Duration(*ss.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	drain := durationFlag(t, c.Args, "drain-timeout")
	delay := durationFlag(t, c.Args, "shutdown-delay")
	if grace <= drain+delay {
		t.Errorf("termination grace %s, want more than the drain timeout %s and the shutdown delay %s", grace, drain, delay)
	}
	wait := durationFlag(t, cmd, "wait")
	if wait < drain+delay || wait >= grace {
		t.Errorf("preStop waits %s, want at least the drain (%s + %s) and less than the grace %s", wait, drain, delay, grace)
	}
}

func durationFlag(t *testing.T, args []string, name string) time.Duration {
	t.Helper()
	s, ok := flag(args, name)
	d, err := time.ParseDuration(s)
	if !ok || err != nil {
		t.Fatalf("--%s=%q: %v", name, s, err)
	}
	return d
}

// checkPlacement: two relays never on one node, spread over zones when
// asked, and a disruption budget over exactly the relays.
func checkPlacement(t *testing.T, m *manifest, ss *appsv1.StatefulSet, v chartValues) {
	pod := labels.Set(ss.Spec.Template.Labels)
	spec := ss.Spec.Template.Spec
	keys := map[string]bool{}
	for _, c := range spec.TopologySpreadConstraints {
		sel, err := metav1LabelSelector(c.LabelSelector)
		if err != nil || !sel.Matches(pod) {
			t.Errorf("spread over %s does not select the relays: %v", c.TopologyKey, err)
		}
		keys[c.TopologyKey] = true
	}
	zones := v.TopologySpread == nil || v.TopologySpread.Zones
	if !keys["kubernetes.io/hostname"] || zones != keys["topology.kubernetes.io/zone"] {
		t.Errorf("spread over %v, want hostnames, and zones: %v", keys, zones)
	}
	anti := spec.Affinity
	if anti == nil || anti.PodAntiAffinity == nil || len(anti.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Fatal("no required pod anti-affinity: two relays could share a node")
	}
	term := anti.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
	if sel, err := metav1LabelSelector(term.LabelSelector); term.TopologyKey != "kubernetes.io/hostname" || err != nil || !sel.Matches(pod) {
		t.Errorf("anti-affinity over %q (%v) does not keep relays off each other's nodes", term.TopologyKey, err)
	}
	if len(m.pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets, want 1", len(m.pdbs))
	}
	pdb := m.pdbs[0]
	if sel, err := metav1LabelSelector(pdb.Spec.Selector); err != nil || !sel.Matches(pod) {
		t.Errorf("the disruption budget does not select the relays: %v", err)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("the disruption budget lets %v relays go at once, want 1", pdb.Spec.MaxUnavailable)
	}
}

// checkHardening: not root, no privilege escalation, no capabilities, a
// read-only root filesystem, no service account token.
func checkHardening(t *testing.T, ss *appsv1.StatefulSet, c *corev1.Container) {
	spec := ss.Spec.Template.Spec
	sc := c.SecurityContext
	switch {
	case spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot:
		t.Error("the pod may run as root")
	case sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the root filesystem is writable")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("privilege escalation is allowed")
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
		t.Error("capabilities are not all dropped")
	case spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken:
		t.Error("a service account token is mounted: relays need no Kubernetes API")
	}
}

// checkSecrets: every Secret the pod mounts is rendered by the chart or is
// one the values name as existing; every file a flag names is mounted.
func checkSecrets(t *testing.T, m *manifest, ss *appsv1.StatefulSet, v chartValues) {
	existing := map[string]bool{v.Admin.ExistingSecret: true, v.FleetSecret.ExistingSecret: true,
		v.NATS.CredsSecret: true, v.NATS.CASecret: true, v.TLS.SecretName: true}
	delete(existing, "")
	mounted := map[string]string{} // volume name -> secret name
	for _, vol := range ss.Spec.Template.Spec.Volumes {
		if vol.Secret == nil {
			continue
		}
		mounted[vol.Name] = vol.Secret.SecretName
		if m.secret(vol.Secret.SecretName) == nil && !existing[vol.Secret.SecretName] {
			t.Errorf("volume %s mounts Secret %q, which is neither rendered nor named in the values", vol.Name, vol.Secret.SecretName)
		}
	}
	c := relayContainer(t, ss)
	for _, f := range []string{"admin-token-file", "fleet-secret-file", "nats-creds", "nats-ca-file", "tls-cert", "tls-key"} {
		path, ok := flag(c.Args, f)
		if !ok {
			continue
		}
		if !underMount(c, path) {
			t.Errorf("--%s=%s is under no volume mount", f, path)
		}
	}
	if s := m.secret("rel-switchboard-admin"); s != nil && v.Admin.ExistingSecret == "" {
		if tok := string(s.Data["token"]); !adminTokenPattern.MatchString(tok) {
			t.Errorf("the generated admin token %q is not an admin token (sbx_<8 hex>_<43 base64url>)", tok)
		}
	}
}

func underMount(c *corev1.Container, path string) bool {
	for _, vm := range c.VolumeMounts {
		if strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") {
			return true
		}
	}
	return false
}

// checkServices: the public Service and the admin Service reach the ports
// of the same names; the peers' Service is headless, lists relays before
// they are ready, and is the one the relays advertise.
func checkServices(t *testing.T, m *manifest, ss *appsv1.StatefulSet, c *corev1.Container) {
	pod := labels.Set(ss.Spec.Template.Labels)
	names := map[string]bool{}
	for _, p := range c.Ports {
		names[p.Name] = true
	}
	var peers *corev1.Service
	for _, s := range m.services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(pod) {
			t.Errorf("Service %s selects no relay", s.Name)
		}
		for _, p := range s.Spec.Ports {
			if !names[p.TargetPort.String()] {
				t.Errorf("Service %s targets port %q, which the relay does not name", s.Name, p.TargetPort.String())
			}
		}
		if s.Name == ss.Spec.ServiceName {
			peers = s
		}
	}
	if peers == nil || peers.Spec.ClusterIP != "None" || !peers.Spec.PublishNotReadyAddresses {
		t.Fatalf("the StatefulSet's Service %q is missing, not headless, or hides relays that are not ready yet", ss.Spec.ServiceName)
	}
	adv, _ := flag(c.Args, "advertise")
	if !strings.Contains(adv, "//$(POD_NAME)."+peers.Name+".$(POD_NAMESPACE).svc:") {
		t.Errorf("relays advertise %q, not their name under the peers' Service %s", adv, peers.Name)
	}
}

// checkNetworkPolicy: when on, anyone reaches the public port and only the
// listed callers (and the relays) the admin port.
func checkNetworkPolicy(t *testing.T, m *manifest, v chartValues) {
	on := v.NetworkPolicy == nil || v.NetworkPolicy.Enabled
	if !on {
		if len(m.networkPolicies) != 0 {
			t.Error("a NetworkPolicy although networkPolicy.enabled is false")
		}
		return
	}
	if len(m.networkPolicies) != 1 {
		t.Fatalf("%d NetworkPolicies, want 1", len(m.networkPolicies))
	}
	for _, rule := range m.networkPolicies[0].Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port.String() == "admin" && len(rule.From) == 0 {
				t.Error("the admin port is open to everyone")
			}
		}
	}
}

// checkScaling: with autoscaling the HPA owns the replica count.
func checkScaling(t *testing.T, m *manifest, ss *appsv1.StatefulSet, v chartValues) {
	if !v.Autoscaling.Enabled {
		if len(m.hpas) != 0 {
			t.Error("an HPA although autoscaling is off")
		}
		return
	}
	if len(m.hpas) != 1 || m.hpas[0].Spec.ScaleTargetRef.Kind != "StatefulSet" || m.hpas[0].Spec.ScaleTargetRef.Name != ss.Name {
		t.Fatalf("the HPA does not scale the relays' StatefulSet: %+v", m.hpas)
	}
	if ss.Spec.Replicas != nil {
		t.Error("the StatefulSet sets replicas although the HPA owns them")
	}
}

// checkMonitoring: the monitoring objects exist when asked for, scrape the
// admin port, and carry the alerts file whole.
func checkMonitoring(t *testing.T, m *manifest, v chartValues) {
	if got := len(m.podMonitors) == 1; got != v.Monitoring.PodMonitor {
		t.Errorf("PodMonitor rendered: %v, asked for: %v", got, v.Monitoring.PodMonitor)
	}
	for _, pm := range m.podMonitors {
		if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != "admin" {
			t.Errorf("the PodMonitor does not scrape the admin port: %+v", pm.Spec.PodMetricsEndpoints)
		}
	}
	if got := len(m.rules) == 1; got != v.Monitoring.PrometheusRule {
		t.Errorf("PrometheusRule rendered: %v, asked for: %v", got, v.Monitoring.PrometheusRule)
	}
	want := alertNames(t)
	for _, r := range m.rules {
		var got []string
		for _, g := range r.Spec.Groups {
			for _, rule := range g.Rules {
				got = append(got, rule.Alert)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("the PrometheusRule has alerts %v, the alerts file %v", got, want)
		}
	}
	dash := false
	for _, cm := range m.configMaps {
		dash = dash || cm.Data["switchboard.json"] != ""
	}
	if dash != v.Monitoring.Dashboard {
		t.Errorf("dashboard ConfigMap rendered: %v, asked for: %v", dash, v.Monitoring.Dashboard)
	}
}
