package fleettest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestConnectRealSSH: the OpenSSH client, with switchboard connect as its
// ProxyCommand, runs a command on a real sshd behind a device's agent,
// through a relay that does not hold the device.
func TestConnectRealSSH(t *testing.T) {
	sshd := testkit.Tool(t, "sshd", "SWITCHBOARD_REQUIRE_SSH")
	ssh := testkit.Tool(t, "ssh", "SWITCHBOARD_REQUIRE_SSH")
	keygen := testkit.Tool(t, "ssh-keygen", "SWITCHBOARD_REQUIRE_SSH")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if me.Uid == "0" {
		// sshd run as root wants its privilege separation directory, which
		// Debian's service unit makes at boot.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Skipf("sshd as root needs /run/sshd: %v", err)
		}
	}
	dir := t.TempDir()
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
	}
	run(keygen, "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, "host"))
	run(keygen, "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, "user"))
	pub, err := os.ReadFile(filepath.Join(dir, "user.pub"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "authorized_keys"), string(pub))
	port := freePort(t)
	write(t, filepath.Join(dir, "sshd_config"), fmt.Sprintf(`ListenAddress 127.0.0.1
HostKey %[1]s/host
AuthorizedKeysFile %[1]s/authorized_keys
PidFile %[1]s/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
`, dir))
	var sshdLog bytes.Buffer
	cmd := exec.Command(sshd, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"), "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = &sshdLog, &sshdLog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("sshd said:\n%s", sshdLog.String())
		}
	})
	sshdAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	Eventually(t, 10*time.Second, func() error {
		c, err := net.Dial("tcp", sshdAddr)
		if err == nil {
			c.Close()
		}
		return err
	})

	bin := buildSwitchboard(t)
	relays := StartFleet(t, 2)
	holder, others := HolderFor(t, relays, "robot")
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "ssh=tcp://"+sshdAddr))
	holder.WaitDevice(t, "robot")
	tokenFile := filepath.Join(dir, "token")
	write(t, tokenFile, FleetToken(t, relays, auth.KindUser, "alice", "robot"))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	proxy := fmt.Sprintf("%s connect --relay %s --token-file %s robot/ssh", bin, others[0].URL, tokenFile)
	out, err := exec.CommandContext(ctx, ssh, "-F", "/dev/null", "-i", filepath.Join(dir, "user"),
		"-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile="+filepath.Join(dir, "known_hosts"),
		"-o", "ProxyCommand="+proxy, me.Username+"@robot", "echo hello").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hello") {
		t.Fatalf("ssh through connect: %v: %s", err, out)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// freePort returns a loopback port free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// buildSwitchboard builds cmd/switchboard into the test's temporary
// directory.
func buildSwitchboard(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "switchboard")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/switchboard-relay/switchboard/cmd/switchboard").CombinedOutput(); err != nil {
		t.Fatalf("build switchboard: %v: %s", err, out)
	}
	return bin
}
