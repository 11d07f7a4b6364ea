package fleettest

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// sniZone is the zone of the passthrough tests' names.
const sniZone = "tls.test"

// deviceTLSServer serves HTTPS on loopback with a certificate for name
// issued by ca, as a device's own TLS service does, until the test ends.
func deviceTLSServer(t *testing.T, ca *CA, name string) string {
	certFile, keyFile := ca.Issue(t, name)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the device over %s", r.Proto)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// sClient runs openssl s_client to addr asking for serverName, verifying
// the server's certificate against caFile and the name, and sends an
// HTTP/1.0 GET; it returns what openssl printed and its error.
func sClient(ctx context.Context, openssl, addr, serverName, caFile string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", addr, "-servername", serverName,
		"-CAfile", caFile, "-verify_return_error", "-verify_hostname", serverName, "-ign_eof")
	cmd.Stdin = strings.NewReader("GET / HTTP/1.0\r\nHost: " + serverName + "\r\n\r\n")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestTLSPassthroughBySNI: a stock TLS client (openssl s_client) asking
// either relay's TLS listener for SERVICE--DEVICE.ZONE reaches the
// device's own TLS server, whose certificate it verifies against the
// device's CA: the relays, which hold no key of it, never decrypt. A
// service the device did not offer for passthrough, an unknown device and
// a name under the zone of the wrong form are refused with a TLS alert;
// the relay's own names are served by the relay as before.
func TestTLSPassthroughBySNI(t *testing.T) {
	openssl := testkit.Tool(t, "openssl", "SWITCHBOARD_REQUIRE_OPENSSL")
	relayCA, deviceCA := NewCA(t), NewCA(t)
	relays := StartTLSFleet(t, 2, relayCA, func(c *node.Config) { c.SNIZone = sniZone })
	holder, others := HolderFor(t, relays, "robot")
	web := deviceTLSServer(t, deviceCA, "web--robot."+sniZone)
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, trusting(relayCA),
		withServices(t, "web=tcp://"+web, "private=tcp://"+web),
		func(c *agent.Config) { c.Passthrough = []string{"web"} })
	holder.WaitDevice(t, "robot")

	for name, r := range map[string]*Relay{"holder": holder, "other": others[0]} {
		addr := r.Node.Addr()
		out, err := sClient(t.Context(), openssl, addr, "web--robot."+sniZone, deviceCA.File)
		if err != nil || !strings.Contains(out, "hello from the device over HTTP/1.0") || !strings.Contains(out, "Verify return code: 0 (ok)") {
			t.Fatalf("through the %s (%s): %v\n%s", name, addr, err, out)
		}
		if !strings.Contains(out, "CN=web--robot."+sniZone) && !strings.Contains(out, "CN = web--robot."+sniZone) {
			t.Fatalf("through the %s: the certificate is not the device's:\n%s", name, out)
		}

		for _, refused := range []string{"private--robot." + sniZone, "web--ghost." + sniZone, "robot." + sniZone} {
			out, err := sClient(t.Context(), openssl, addr, refused, deviceCA.File)
			if err == nil || !strings.Contains(out, "unrecognized name") || strings.Contains(out, "hello from the device") {
				t.Errorf("through the %s, %s: %v, want a TLS alert unrecognized name:\n%s", name, refused, err, out)
			}
		}

		// A name outside the zone, and none at all (Go sends no SNI for an
		// IP address): the relay's own certificate and API.
		out, err = sClient(t.Context(), openssl, addr, "localhost", relayCA.File)
		if err != nil || !strings.Contains(out, "Verify return code: 0 (ok)") || !strings.Contains(out, "CN=relay") && !strings.Contains(out, "CN = relay") {
			t.Fatalf("the relay's own name through the %s: %v\n%s", name, err, out)
		}
		resp, err := relayCA.Client(t, true).Get(r.URL + "/healthz")
		if err != nil {
			t.Fatalf("the relay's own TLS through the %s: %v", name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.TLS == nil || resp.TLS.PeerCertificates[0].Subject.CommonName != "relay" {
			t.Fatalf("the relay's own TLS through the %s: %d %q", name, resp.StatusCode, body)
		}
	}

	// Go's TLS client, with HTTP/2 by ALPN, end to end to the device.
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: deviceCA.Pool},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", others[0].Node.Addr())
		},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://web--robot." + sniZone + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello from the device over HTTP/2.0" {
		t.Fatalf("Go's client through the other relay: %q", body)
	}
}
