package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestRenderedRelayRuns starts the relay exactly as the chart's StatefulSet
// would — its arguments, environment and mounted files, with the paths
// moved under a temporary root — on a NATS of its own, and checks the rest
// of what the pod spec promises: the probes answer on the ports they name,
// the id is the one its name gives, every metric the alerts and the
// dashboard query is served, and the preStop hook drains the relay and
// returns once it has stopped.
func TestRenderedRelayRuns(t *testing.T) {
	bin := switchboard(t)
	natsURL := startNATS(t, bin)
	public, admin := freePort(t), freePort(t)
	m := render(t, "switchboard", deployPath(t, "helm", "switchboard", "ci", "default-values.yaml"),
		"ports.public="+strconv.Itoa(public), "ports.admin="+strconv.Itoa(admin),
		"nats.url="+natsURL, "nats.replicas=1", "drainTimeout=5s", "shutdownDelay=1s")
	ss := m.statefulSets[0]
	c := relayContainer(t, ss)
	pod := &fakePod{t: t, root: t.TempDir(), name: ss.Name + "-0", m: m, spec: &ss.Spec.Template.Spec, c: c}
	pod.mount()

	relay := pod.start(bin, c.Args)
	base := "http://127.0.0.1:" + strconv.Itoa(admin)
	for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		url := fmt.Sprintf("http://127.0.0.1:%d%s", pod.port(p.HTTPGet.Port.String()), p.HTTPGet.Path)
		testkit.Eventually(t, 20*time.Second, func() error { return get200(url) })
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/client/nothing-here/", public))
	if err != nil {
		t.Fatalf("the public port %d does not answer: %v", public, err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 || resp.StatusCode == http.StatusNotFound {
		t.Fatalf("a request for an unknown device through the public port: %s, want the relay's refusal", resp.Status)
	}

	tokenFile, _ := flag(pod.args(c.Args), "admin-token-file")
	out, err := exec.Command(bin, "ctl", "--admin", base, "--token-file", tokenFile, "-o", "json", "status").CombinedOutput()
	if err != nil {
		t.Fatalf("ctl status with the chart's admin token: %v\n%s", err, out)
	}
	var st struct {
		RelayID string `json:"relay_id"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatal(err)
	}
	if want := fleet.RelayIDFromName(namespace + "/" + pod.name); st.RelayID != want {
		t.Errorf("relay id %s, want %s from the pod's name", st.RelayID, want)
	}

	metrics := scrape(t, base+"/metrics")
	for _, name := range metricNames(t) {
		if !metrics[name] {
			t.Errorf("the alerts or the dashboard query %s, which the relay does not serve", name)
		}
	}

	hook := pod.args(c.Lifecycle.PreStop.Exec.Command)
	hook[0] = bin
	if out, err := exec.Command(hook[0], hook[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("the preStop hook %v: %v\n%s", hook, err, out)
	}
	select {
	case <-relay.exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay still runs after its preStop hook returned")
	}
	if relay.err != nil {
		t.Fatalf("the relay exited with %v after its preStop hook\n%s", relay.err, relay.log.String())
	}
	if log := relay.log.String(); !strings.Contains(log, "relay draining") {
		t.Errorf("the relay did not drain before it stopped:\n%s", log)
	}
}

// fakePod lays out a pod's mounted files under root and starts its
// container's program with the same arguments and environment.
type fakePod struct {
	t    *testing.T
	root string
	name string
	m    *manifest
	spec *corev1.PodSpec
	c    *corev1.Container
}

// mount writes each mounted Secret's keys as files and makes each emptyDir.
func (p *fakePod) mount() {
	vols := map[string]corev1.Volume{}
	for _, v := range p.spec.Volumes {
		vols[v.Name] = v
	}
	for _, vm := range p.c.VolumeMounts {
		dir := filepath.Join(p.root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			p.t.Fatal(err)
		}
		v, ok := vols[vm.Name]
		if !ok {
			p.t.Fatalf("mount %s names no volume", vm.Name)
		}
		if v.Secret == nil {
			continue
		}
		s := p.m.secret(v.Secret.SecretName)
		if s == nil {
			p.t.Fatalf("Secret %s is not rendered", v.Secret.SecretName)
		}
		for k, b := range s.Data {
			if err := os.WriteFile(filepath.Join(dir, k), b, 0o400); err != nil {
				p.t.Fatal(err)
			}
		}
	}
}

var envRef = regexp.MustCompile(`\$\(([A-Z_]+)\)`)

// env is the container's environment as the kubelet would give it.
func (p *fakePod) env() map[string]string {
	env := map[string]string{}
	for _, e := range p.c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = map[string]string{"metadata.name": p.name, "metadata.namespace": namespace}[e.ValueFrom.FieldRef.FieldPath]
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil:
			q := p.c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits."))]
			env[e.Name] = strconv.FormatInt(q.Value(), 10)
		default:
			env[e.Name] = e.Value
		}
	}
	return env
}

// args expands $(VAR) in args and moves mounted paths under the root.
func (p *fakePod) args(args []string) []string {
	env := p.env()
	out := make([]string, len(args))
	for i, a := range args {
		a = envRef.ReplaceAllStringFunc(a, func(ref string) string { return env[envRef.FindStringSubmatch(ref)[1]] })
		for _, vm := range p.c.VolumeMounts {
			a = strings.ReplaceAll(a, "="+vm.MountPath, "="+filepath.Join(p.root, vm.MountPath))
		}
		out[i] = a
	}
	return out
}

// port returns the number of the container's port named name.
func (p *fakePod) port(name string) int32 {
	for _, cp := range p.c.Ports {
		if cp.Name == name {
			return cp.ContainerPort
		}
	}
	p.t.Fatalf("no container port named %q", name)
	return 0
}

// proc is a running program.
type proc struct {
	log    testkit.Buffer
	exited chan struct{}
	err    error
}

func (p *fakePod) start(bin string, args []string) *proc {
	cmd := exec.Command(bin, p.args(args)...)
	cmd.Env = os.Environ()
	for k, v := range p.env() {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return startProc(p.t, cmd)
}

func startProc(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	pr := &proc{exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &pr.log, &pr.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		pr.err = cmd.Wait()
		close(pr.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-pr.exited:
		default:
			cmd.Process.Kill()
			<-pr.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(cmd.Path), pr.log.String())
		}
	})
	return pr
}

// startNATS runs a relay whose embedded NATS server also listens on
// loopback, and returns that server's URL: the fleet state for the relay
// under test.
func startNATS(t *testing.T, bin string) string {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command(bin, "serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:"+strconv.Itoa(port))
	pr := startProc(t, cmd)
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	testkit.Eventually(t, 20*time.Second, func() error {
		select {
		case <-pr.exited:
			t.Fatalf("the NATS relay exited: %v\n%s", pr.err, pr.log.String())
		default:
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		line, err := bufio.NewReader(c).ReadString('\n')
		if !strings.HasPrefix(line, "INFO ") {
			return fmt.Errorf("NATS greeting %q, %v", line, err)
		}
		return nil
	})
	return url
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func get200(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s %s", url, resp.Status, b)
	}
	return nil
}

// scrape returns the names of the metrics served at url.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
		}
	}
	return names
}
