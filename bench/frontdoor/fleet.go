package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/control"
	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// relayProc is one `switchboard serve` process on a loopback address of
// its own (127.0.0.11, .12, …).
type relayProc struct {
	n               int
	ip, port, admin string
	dir             string
	id              string
	cmd             *exec.Cmd
	done            chan struct{}
}

func (r *relayProc) url() string      { return "http://" + net.JoinHostPort(r.ip, r.port) }
func (r *relayProc) adminURL() string { return "http://" + net.JoinHostPort(r.ip, r.admin) }

func (r *relayProc) alive() bool {
	if r.done == nil {
		return false // never started
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// setup is what one run starts: NATS (in this process, so that any relay
// may die), three relays, a backend, the front door, and the agents.
type setup struct {
	bin, root, dir string
	keepArriving   bool
	store          *store.Store
	relays         []*relayProc
	token          string // the admin token every relay runs
	front          *frontDoor
	backend        *http.Server
	devices        []string
	client         *http.Client
	stopAgents     context.CancelFunc
}

// options say what one run starts.
type options struct {
	native, longpoll int
	keepArriving     bool
}

func startSetup(ctx context.Context, bin, root, dir, kind string, o options) (s *setup, err error) {
	s = &setup{bin: bin, root: root, dir: dir, keepArriving: o.keepArriving,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.store, err = store.Open(ctx, store.Config{DataDir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0"}); err != nil {
		return s, err
	}
	for i := range 3 {
		r := &relayProc{n: i + 1, ip: fmt.Sprintf("127.0.0.%d", 11+i), dir: filepath.Join(dir, fmt.Sprintf("relay%d", i+1))}
		r.port, r.admin = freePortOn(r.ip), freePortOn(r.ip)
		s.relays = append(s.relays, r)
		if err := s.startRelay(ctx, r); err != nil {
			return s, err
		}
		if i == 0 {
			// The first relay writes the admin token the others read.
			b, err := os.ReadFile(filepath.Join(dir, "admin.token"))
			if err != nil {
				return s, err
			}
			s.token = strings.TrimSpace(string(b))
		}
	}
	if err := s.waitFresh(ctx); err != nil {
		return s, err
	}
	if s.front, err = startFrontDoor(ctx, kind, root, dir, s.relays); err != nil {
		return s, err
	}
	backend, err := startBackend()
	if err != nil {
		return s, err
	}
	s.backend = backend
	actx, cancel := context.WithCancel(context.Background())
	s.stopAgents = cancel
	front, _ := url.Parse(s.front.url)
	bu, _ := url.Parse("http://" + backend.Addr)
	for i := range o.native + o.longpoll {
		proto, name := agent.ProtocolNative, fmt.Sprintf("n-%03d", i)
		if i >= o.native {
			proto, name = agent.ProtocolLongPoll, fmt.Sprintf("lp-%03d", i-o.native)
		}
		s.devices = append(s.devices, name)
		// Agents know only the front door, as in a real deployment.
		a, err := agent.New(agent.Config{Relays: []*url.URL{front}, Device: name, Backend: bu, Protocol: proto, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return s, err
		}
		go a.Run(actx)
	}
	return s, s.waitOnline(ctx)
}

// freePortOn returns a TCP port free on ip a moment ago.
func freePortOn(ip string) string {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return benchkit.FreePort()
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

func (s *setup) startRelay(ctx context.Context, r *relayProc) error {
	args := []string{"serve", "--listen", net.JoinHostPort(r.ip, r.port), "--admin-listen", net.JoinHostPort(r.ip, r.admin),
		"--data", r.dir, "--nats", s.store.ClientURL(), "--advertise", r.url(), "--relay-name", fmt.Sprintf("relay-%d", r.n),
		"--admin-token-file", filepath.Join(s.dir, "admin.token"),
		"--allow-anonymous-users", "--allow-anonymous-agents", "--log-level", "error"}
	if s.keepArriving {
		args = append(args, "--keep-arriving-agents")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start relay %d: %w", r.n, err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(r.cmd, r.done)
	r.id = fleet.RelayIDFromName(fmt.Sprintf("relay-%d", r.n))
	return benchkit.Poll(ctx, 20*time.Second, 20*time.Millisecond, func() error {
		if !r.alive() {
			return fmt.Errorf("relay %d exited", r.n)
		}
		resp, err := s.client.Get(r.adminURL() + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}

// api is an operator API client on a live relay.
func (s *setup) api() *control.Client {
	for _, r := range s.relays {
		if r.alive() {
			return &control.Client{BaseURL: r.adminURL(), Token: s.token, HTTPClient: s.client}
		}
	}
	return nil
}

// waitFresh waits until every live relay sees every live relay fresh.
func (s *setup) waitFresh(ctx context.Context) error {
	live := 0
	for _, r := range s.relays {
		if r.alive() {
			live++
		}
	}
	return benchkit.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		for _, r := range s.relays {
			if !r.alive() {
				continue
			}
			fresh, err := benchkit.FreshRelays(ctx, &control.Client{BaseURL: r.adminURL(), Token: s.token, HTTPClient: s.client})
			if err != nil {
				return err
			}
			if fresh < live {
				return fmt.Errorf("relay %d sees %d fresh relays of %d", r.n, fresh, live)
			}
		}
		return nil
	})
}

// holders returns the directory: device → relay id, for the online devices.
func (s *setup) holders(ctx context.Context) (map[string]string, error) {
	ds, err := s.api().ListDevices(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range ds {
		if d.State == fleet.StateOnline && slices.Contains(s.devices, d.Name) {
			out[d.Name] = d.RelayID
		}
	}
	return out, nil
}

// waitOnline waits until every device is online and answers through the
// front door.
func (s *setup) waitOnline(ctx context.Context) error {
	err := benchkit.Poll(ctx, 60*time.Second, 50*time.Millisecond, func() error {
		h, err := s.holders(ctx)
		if err != nil {
			return err
		}
		if len(h) < len(s.devices) {
			return fmt.Errorf("%d of %d devices online", len(h), len(s.devices))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, d := range s.devices {
		if err := benchkit.Poll(ctx, 30*time.Second, 20*time.Millisecond, func() error { return s.get(d, d, false) }); err != nil {
			return fmt.Errorf("device %s through the front door: %w", d, err)
		}
	}
	return nil
}

// get sends one small GET for device through the front door, by path or by
// X-Server-Name.
func (s *setup) get(device, tag string, byHeader bool) error {
	u := s.front.url + "/client/" + device + "/small?" + tag
	if byHeader {
		u = s.front.url + "/small?" + tag
	}
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	if byHeader {
		req.Header.Set("X-Server-Name", device)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", device, resp.Status)
	}
	return nil
}

// forwards sums switchboard_router_forwards_total over the live relays.
func (s *setup) forwards() float64 {
	var sum float64
	for _, r := range s.relays {
		if !r.alive() {
			continue
		}
		sum += counter(s.client, r.adminURL()+"/metrics", "switchboard_router_forwards_total")
	}
	return sum
}

// counter sums every series of the metric name on a Prometheus page.
func counter(c *http.Client, u, name string) float64 {
	resp, err := c.Get(u)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			var v float64
			fields := strings.Fields(line)
			fmt.Sscan(fields[len(fields)-1], &v)
			sum += v
		}
	}
	return sum
}

func (s *setup) close() {
	if s.stopAgents != nil {
		s.stopAgents()
	}
	if s.front != nil {
		s.front.stop()
	}
	for _, r := range s.relays {
		if r.alive() {
			r.cmd.Process.Kill()
			<-r.done
		}
	}
	if s.backend != nil {
		s.backend.Close()
	}
	if s.store != nil {
		s.store.Close()
	}
	s.client.CloseIdleConnections()
}

func startBackend() (*http.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return srv, nil
}
