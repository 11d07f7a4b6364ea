package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/fleettest"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestServeProcess builds the switchboard binary once and runs 'switchboard
// serve' as a real process: signals, exit codes and the files it leaves.
func TestServeProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := filepath.Join(t.TempDir(), "switchboard")
	build := exec.Command("go", "build", "-o", bin, "github.com/switchboard-relay/switchboard/cmd/switchboard")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, proto := range []string{agent.ProtocolNative, agent.ProtocolLongPoll} {
		t.Run("SIGTERM drains and exits 0/"+proto, func(t *testing.T) { testDrainOnSIGTERM(t, bin, proto) })
	}
	t.Run("second SIGTERM stops at once", func(t *testing.T) { testSecondSIGTERM(t, bin) })
	t.Run("admin token written once and reused", func(t *testing.T) { testAdminToken(t, bin) })
	t.Run("taken port fails with a message", func(t *testing.T) { testTakenPort(t, bin) })
	t.Run("ctl stop drains and stops; a relay name keeps its id", func(t *testing.T) { testStopAndName(t, bin) })
}

// relayProc is a running 'switchboard serve'.
type relayProc struct {
	cmd    *exec.Cmd
	stdout *testkit.Buffer
	stderr *testkit.Buffer
	exited chan struct{} // closed when the process has exited
	err    error         // what Wait returned; read after exited
	addr   string        // public listener
	admin  string        // admin listener
	token  string        // admin token path, from the banner
}

var banner = regexp.MustCompile(`switchboard relay listening on (\S+) \(admin (\S+)\)\nadmin token: (\S+)\n`)

// startServe runs 'switchboard serve' on loopback port 0 with data in dir
// and extra flags, and waits for its banner to learn the addresses.
func startServe(t *testing.T, bin, dir string, flags ...string) *relayProc {
	t.Helper()
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data", dir}, flags...)
	p := &relayProc{cmd: exec.Command(bin, args...), stdout: new(testkit.Buffer), stderr: new(testkit.Buffer), exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("serve stderr:\n%s", p.stderr.String())
		}
	})
	fleettest.Eventually(t, 30*time.Second, func() error {
		if m := banner.FindStringSubmatch(p.stdout.String()); m != nil {
			p.addr, p.admin, p.token = m[1], m[2], m[3]
			return nil
		}
		select {
		case <-p.exited:
			t.Fatalf("serve exited before listening: %v\n%s", p.err, p.stderr.String())
		default:
		}
		return fmt.Errorf("no banner yet; stdout %q", p.stdout.String())
	})
	return p
}

func (p *relayProc) signal(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
}

// wait waits up to timeout for the process to exit and returns its exit code.
func (p *relayProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		t.Fatalf("serve did not exit within %v", timeout)
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	default:
		t.Fatalf("wait: %v", p.err)
		return -1
	}
}

// streamBackend holds /stream open until release is closed; /ping answers.
type streamBackend struct {
	url     string
	release chan struct{}
}

func newStreamBackend(t *testing.T) *streamBackend {
	b := &streamBackend{release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/ping", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pong") })
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "start\n")
		http.NewResponseController(w).Flush()
		select {
		case <-b.release:
			io.WriteString(w, "end\n")
		case <-r.Context().Done():
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

// runAgent runs an in-process agent for device "dev" speaking proto against
// the relay and waits until a request reaches the backend through it.
func runAgent(t *testing.T, p *relayProc, backend, proto string) {
	t.Helper()
	bu, _ := url.Parse(backend)
	a, err := agent.New(agent.Config{
		Relays:   []*url.URL{{Scheme: "http", Host: p.addr}},
		Device:   "dev",
		Backend:  bu,
		Protocol: proto,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	c := fleettest.NewClient(t, false)
	fleettest.Eventually(t, 15*time.Second, func() error {
		code, err := fleettest.Status(c, "http://"+p.addr+"/client/dev/ping")
		if code != http.StatusOK {
			return fmt.Errorf("ping through the relay: %d %v", code, err)
		}
		return nil
	})
}

// openStream starts GET /client/dev/stream and reads its first line.
func openStream(t *testing.T, p *relayProc) *bufio.Reader {
	t.Helper()
	resp, err := fleettest.NewClient(t, false).Get("http://" + p.addr + "/client/dev/stream")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); resp.StatusCode != http.StatusOK || line != "start\n" {
		t.Fatalf("stream: %s %q %v", resp.Status, line, err)
	}
	return rd
}

// testDrainOnSIGTERM: with a stream in flight, SIGTERM turns /readyz 503,
// lets the stream finish, and exits 0 once it has.
func testDrainOnSIGTERM(t *testing.T, bin, proto string) {
	p := startServe(t, bin, t.TempDir(), "--allow-anonymous-users", "--allow-anonymous-agents", "--drain-timeout", "20s")
	b := newStreamBackend(t)
	runAgent(t, p, b.url, proto)
	c := fleettest.NewClient(t, false)
	if code, err := fleettest.Status(c, "http://"+p.admin+"/readyz"); code != http.StatusOK {
		t.Fatalf("admin /readyz before SIGTERM: %d %v", code, err)
	}
	rd := openStream(t, p)

	start := time.Now()
	p.signal(t)
	// With a stream in flight the drain lasts until it ends: /readyz turns 503.
	fleettest.Eventually(t, 10*time.Second, func() error {
		code, err := fleettest.Status(c, "http://"+p.admin+"/readyz")
		if code == http.StatusServiceUnavailable {
			return nil
		}
		return fmt.Errorf("admin /readyz during the drain: %d %v, want 503", code, err)
	})
	select {
	case <-p.exited:
		t.Fatalf("serve exited with a stream in flight: %v", p.err)
	default:
	}
	close(b.release)
	if rest, err := io.ReadAll(rd); string(rest) != "end\n" || err != nil {
		t.Fatalf("the stream in flight ended with %q, %v; want it to finish", rest, err)
	}
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("the drain took %v although nothing was left in flight", took)
	}
	if !strings.Contains(p.stderr.String(), "draining") {
		t.Fatalf("no drain in the log:\n%s", p.stderr.String())
	}
}

// testSecondSIGTERM: a second SIGTERM during a drain held by a stream that
// never ends stops the process at once, long before --drain-timeout.
func testSecondSIGTERM(t *testing.T, bin string) {
	p := startServe(t, bin, t.TempDir(), "--allow-anonymous-users", "--allow-anonymous-agents", "--drain-timeout", "30s")
	b := newStreamBackend(t)
	runAgent(t, p, b.url, agent.ProtocolLongPoll)
	rd := openStream(t, p) // never released: would hold the drain for 30 s
	c := fleettest.NewClient(t, false)

	start := time.Now()
	p.signal(t)
	fleettest.Eventually(t, 5*time.Second, func() error {
		if code, err := fleettest.Status(c, "http://"+p.admin+"/readyz"); code != http.StatusServiceUnavailable {
			return fmt.Errorf("admin /readyz %d %v: the drain has not begun", code, err)
		}
		return nil
	})
	p.signal(t)
	if code := p.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("exit code %d after the second SIGTERM, want 0", code)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("exited %v after the first signal, want well before the 30 s drain timeout", took)
	}
	if _, err := io.Copy(io.Discard, rd); err == nil {
		t.Fatal("the stream cut by the second signal ended cleanly")
	}
	if !strings.Contains(p.stderr.String(), "second signal") {
		t.Fatalf("no second-signal message in the log:\n%s", p.stderr.String())
	}
}

// testAdminToken: the first start writes <data>/admin.token with mode 0600;
// the second start keeps it, and it still opens the admin API.
func testAdminToken(t *testing.T, bin string) {
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.token")
	p := startServe(t, bin, dir)
	if p.token != path {
		t.Fatalf("banner names the admin token %q, want %q", p.token, path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("admin token not written: %v", err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Fatalf("admin token mode %v, want 0600", mode)
	}
	first, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(first)) == 0 {
		t.Fatalf("admin token %q, %v", first, err)
	}
	checkAdminToken(t, p, first)
	p.signal(t)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}

	p = startServe(t, bin, dir)
	second, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, second) {
		t.Fatalf("the second start replaced the admin token")
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin token after the second start: %v, %v", fi.Mode(), err)
	}
	checkAdminToken(t, p, second) // still valid in the store the second process opened
	p.signal(t)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// testTakenPort: a listener that cannot open ends serve with exit code 1
// and a message naming it, not a panic.
func testTakenPort(t *testing.T, bin string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(bin, "serve", "--listen", ln.Addr().String(), "--admin-listen", "127.0.0.1:0", "--data", t.TempDir())
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("serve on a taken port did not exit")
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Contains(stderr.String(), "panic") ||
		!strings.Contains(stderr.String(), "public listener") {
		t.Fatalf("serve on a taken port: %v; want exit code 1 and a message naming the public listener, no panic; stderr:\n%s", err, stderr.String())
	}
}

// checkAdminToken lists tokens on the admin API with token.
func checkAdminToken(t *testing.T, p *relayProc, token []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+p.admin+"/api/v1/tokens", nil)
	req.Header.Set("Authorization", "Bearer "+string(bytes.TrimSpace(token)))
	resp, err := fleettest.NewClient(t, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("admin API with the token file's token: %s %s", resp.Status, b)
	}
}

// testStopAndName: a relay started with --relay-name and --admin-token-file
// (as the Helm chart starts it) takes its id from its name and its admin
// token from the file; 'ctl stop' (the chart's preStop) drains it as SIGTERM
// would and returns once it no longer serves; started again with a new data
// directory, it is the same relay.
func testStopAndName(t *testing.T, bin string) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	const name = "switchboard/switchboard-0"
	want := fleet.RelayIDFromName(name)
	for round := range 2 {
		p := startServe(t, bin, t.TempDir(), "--relay-name", name, "--admin-token-file", tokenFile)
		if p.token != tokenFile {
			t.Fatalf("round %d: banner names the admin token %q, want %q", round, p.token, tokenFile)
		}
		out, err := exec.Command(bin, "ctl", "--admin", "http://"+p.admin, "--token-file", tokenFile, "-o", "json", "status").Output()
		if err != nil {
			t.Fatalf("round %d: ctl status: %v", round, err)
		}
		var st struct {
			RelayID string `json:"relay_id"`
		}
		if err := json.Unmarshal(out, &st); err != nil || st.RelayID != want {
			t.Fatalf("round %d: relay id %q (%v), want %q derived from %q", round, st.RelayID, err, want, name)
		}
		stop := exec.Command(bin, "ctl", "--admin", "http://"+p.admin, "--token-file", tokenFile, "stop", "--wait", "20s")
		if out, err := stop.CombinedOutput(); err != nil || !strings.Contains(string(out), "drained and stopped") {
			t.Fatalf("round %d: ctl stop: %v\n%s", round, err, out)
		}
		if code := p.wait(t, 5*time.Second); code != 0 {
			t.Fatalf("round %d: exit code %d after ctl stop, want 0", round, code)
		}
		if log := p.stderr.String(); !strings.Contains(log, "stop asked for") || !strings.Contains(log, "relay draining") {
			t.Fatalf("round %d: no drain asked for through the API in the log:\n%s", round, log)
		}
	}
}
