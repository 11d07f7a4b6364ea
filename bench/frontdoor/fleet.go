package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
	"github.com/switchboard-relay/switchboard/internal/agent"
)

// setup is what one run starts: NATS (in this process, so that any relay
// may die), three relays on loopback addresses of their own (127.0.0.11,
// .12, …), a backend, the front door, and the agents.
type setup struct {
	bin, root, dir string
	f              *procfleet.Fleet
	front          *frontDoor
	backend        *procfleet.Backend
	agents         *procfleet.Agents
	devices        []string
	client         *http.Client
}

// options say what one run starts.
type options struct {
	native, longpoll int
	keepArriving     bool
}

func startSetup(ctx context.Context, bin, root, dir, kind string, o options) (s *setup, err error) {
	s = &setup{bin: bin, root: root, dir: dir,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	cfg := procfleet.Config{Bin: bin, Dir: dir, Relays: 3, Named: true, Output: os.Stderr,
		Host: func(n int) string { return fmt.Sprintf("127.0.0.%d", 10+n) }}
	if o.keepArriving {
		cfg.Args = []string{"--keep-arriving-agents"}
	}
	if s.f, err = procfleet.Start(ctx, cfg); err != nil {
		return s, err
	}
	if s.front, err = startFrontDoor(ctx, kind, root, dir, s.f.Relays()); err != nil {
		return s, err
	}
	if s.backend, err = procfleet.StartBackend(); err != nil {
		return s, err
	}
	s.agents = procfleet.NewAgents(context.Background())
	front, _ := url.Parse(s.front.url)
	for i := range o.native + o.longpoll {
		proto, name := agent.ProtocolNative, fmt.Sprintf("n-%03d", i)
		if i >= o.native {
			proto, name = agent.ProtocolLongPoll, fmt.Sprintf("lp-%03d", i-o.native)
		}
		s.devices = append(s.devices, name)
		// Agents know only the front door, as in a real deployment.
		if err := s.agents.Start(agent.Config{Relays: []*url.URL{front}, Device: name, Backend: s.backend.URL(), Protocol: proto}); err != nil {
			return s, err
		}
	}
	return s, s.waitOnline(ctx)
}

// holders returns the directory: device → relay id, for the online devices.
func (s *setup) holders(ctx context.Context) (map[string]string, error) {
	online, err := s.f.Online(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range s.devices {
		if r, ok := online[d]; ok {
			out[d] = r
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
	for _, r := range s.f.Relays() {
		if !r.Alive() {
			continue
		}
		sum += counter(s.client, r.AdminURL()+"/metrics", "switchboard_router_forwards_total")
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
	if s.agents != nil {
		s.agents.Stop()
	}
	if s.front != nil {
		s.front.stop()
	}
	if s.f != nil {
		s.f.Close()
	}
	if s.backend != nil {
		s.backend.Close()
	}
	s.client.CloseIdleConnections()
}
