package test

import (
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestAgentChart renders the agent chart with each of its values files: the
// objects decode strictly, the agent runs hardened with no Kubernetes rights,
// every file a flag names is mounted, and for a cluster's API server it
// verifies the server with the cluster's own CA.
func TestAgentChart(t *testing.T) {
	for _, file := range valuesFiles(t, "switchboard-agent") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			m := render(t, "switchboard-agent", file)
			if len(m.deployments) != 1 {
				t.Fatalf("%d Deployments, want 1", len(m.deployments))
			}
			spec := m.deployments[0].Spec.Template.Spec
			if len(spec.Containers) != 1 || spec.Containers[0].Args[0] != "agent" {
				t.Fatalf("containers %+v, want one running 'agent'", spec.Containers)
			}
			c := &spec.Containers[0]
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Error("a service account token is mounted: the agent needs no Kubernetes rights")
			}
			if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot {
				t.Error("the agent may run as root or write its root filesystem")
			}
			for _, f := range []string{"token-file", "ca-file", "backend-ca-file"} {
				if path, ok := flag(c.Args, f); ok && !underMount(c, path) {
					t.Errorf("--%s=%s is under no volume mount", f, path)
				}
			}
			if _, ok := flag(c.Args, "device"); !ok {
				t.Error("no --device")
			}
			if backend, _ := flag(c.Args, "backend"); backend == "https://kubernetes.default.svc" {
				checkClusterCA(t, spec, c)
			}
		})
	}
}

// checkClusterCA: an agent for the API server verifies it with the CA
// every namespace has, and leaves the Host to the API server's own name.
func checkClusterCA(t *testing.T, spec corev1.PodSpec, c *corev1.Container) {
	ca, _ := flag(c.Args, "backend-ca-file")
	for _, vm := range c.VolumeMounts {
		if !strings.HasPrefix(ca, vm.MountPath+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == "kube-root-ca.crt" && strings.HasSuffix(ca, "/ca.crt") {
				if host, _ := flag(c.Args, "preserve-host"); host != "false" {
					t.Error("the agent sends the user's Host to the API server, whose certificate names its own")
				}
				return
			}
		}
	}
	t.Errorf("--backend-ca-file=%q is not the cluster's CA (ConfigMap kube-root-ca.crt, key ca.crt)", ca)
}
