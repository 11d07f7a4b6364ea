// Package test checks the deployment files in deploy/ offline: the Helm
// charts rendered with several values files and decoded strictly into the
// Kubernetes API types, the rendered relay run as the chart would run it,
// the alerts and the dashboard against the metrics a relay serves, and the
// systemd units and bare-metal examples through their own tools' checks.
//
// It is a module of its own so that the Kubernetes API types it decodes
// into are not dependencies of Switchboard itself.
package test
