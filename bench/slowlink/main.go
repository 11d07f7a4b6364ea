// Command slowlink measures the native tunnel over a slow link: a
// toxiproxy between the agent and the relay adds latency and a bandwidth
// limit each way, and the same toxics sit on a plain TCP path to the same
// backend, so that the tunnel is compared with what the link itself allows.
//
//	go run ./bench/slowlink -toxiproxy /path/to/toxiproxy-server
//
// Two figures per path: a small GET's time, in round trips of the link
// (a GET over a plain connection costs one), and one large download's rate.
// The harness starts toxiproxy from the binary it is given; it builds none.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
)

// options are the run's settings, from flags.
type options struct {
	toxiproxy  string
	bin        string
	latency    time.Duration // added each way
	rateKBps   int           // each way, in toxiproxy's KB/s (1,000 bytes)
	downloadMB int
	requests   int
	versions   []int
	dir        string
}

func main() {
	var o options
	flag.StringVar(&o.toxiproxy, "toxiproxy", "", "toxiproxy-server binary (default: toxiproxy-server on PATH)")
	flag.StringVar(&o.bin, "bin", "", "switchboard binary (default: build one)")
	flag.DurationVar(&o.latency, "latency", 40*time.Millisecond, "latency the link adds each way")
	mbit := flag.Int("rate-mbit", 100, "the link's bandwidth each way, Mbit/s")
	flag.IntVar(&o.downloadMB, "download-mb", 100, "size of the download, MB")
	flag.IntVar(&o.requests, "requests", 20, "small GETs per path")
	versions := flag.String("tunnel-versions", "2,1", "tunnel versions to measure, in order")
	flag.Parse()
	o.rateKBps = *mbit * 1000 / 8
	for _, v := range strings.Split(*versions, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || (n != 1 && n != 2) {
			log.Fatalf("-tunnel-versions %q: a list of 1 and 2", *versions)
		}
		o.versions = append(o.versions, n)
	}
	if o.toxiproxy == "" {
		p, err := exec.LookPath("toxiproxy-server")
		if err != nil {
			log.Fatal("no toxiproxy-server on PATH: pass -toxiproxy PATH (go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0)")
		}
		o.toxiproxy = p
	}
	fmt.Printf("link: %v each way, %d Mbit/s each way (toxiproxy %s); load average %s\n",
		o.latency, o.rateKBps*8/1000, o.toxiproxy, loadavg())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	results, err := run(ctx, o)
	if err != nil {
		log.Fatal(err)
	}
	report(results, o)
}

// result is one path's figures.
type result struct {
	name     string
	getP50   time.Duration
	getMax   time.Duration
	download float64 // MB/s
}

func run(ctx context.Context, o options) ([]result, error) {
	dir, err := os.MkdirTemp("", "switchboard-slowlink-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	o.dir = dir
	if o.bin, err = benchkit.Binary(o.bin, dir); err != nil {
		return nil, err
	}
	backend, err := startBackend()
	if err != nil {
		return nil, err
	}
	defer backend.Close()

	tox, err := startToxiproxy(ctx, o.toxiproxy, dir)
	if err != nil {
		return nil, err
	}
	defer tox.proc.Stop(5 * time.Second)

	var results []result

	plainAddr, err := tox.proxy(ctx, "plain", backend.Addr().String(), o)
	if err != nil {
		return nil, err
	}
	plain, err := measure(ctx, "plain TCP through the link", "http://"+plainAddr, o, true)
	if err != nil {
		return nil, err
	}
	results = append(results, plain)

	port, admin := benchkit.FreePort(), benchkit.FreePort()
	relayLog, err := os.Create(filepath.Join(dir, "relay.log"))
	if err != nil {
		return nil, err
	}
	relay, err := procfleet.StartProc("relay", o.bin, []string{"serve",
		"--listen", "127.0.0.1:" + port, "--admin-listen", "127.0.0.1:" + admin,
		"--data", filepath.Join(dir, "relay"), "--allow-anonymous-users", "--allow-anonymous-agents",
		"--log-level", "warn"}, relayLog)
	if err != nil {
		return nil, err
	}
	defer relay.Stop(5 * time.Second)
	tunnelAddr, err := tox.proxy(ctx, "tunnel", "127.0.0.1:"+port, o)
	if err != nil {
		return nil, err
	}
	for _, v := range o.versions {
		r, err := measureTunnel(ctx, o, v, tunnelAddr, port, backend.Addr().String())
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// measureTunnel starts an agent whose tunnel crosses the link, measures
// through the relay, and stops the agent.
func measureTunnel(ctx context.Context, o options, version int, tunnelAddr, relayPort, backend string) (result, error) {
	device := fmt.Sprintf("slow%d", version)
	logPath := filepath.Join(o.dir, device+".log")
	out, err := os.Create(logPath)
	if err != nil {
		return result{}, err
	}
	defer out.Close()
	agent, err := procfleet.StartProc("agent", o.bin, []string{"agent",
		"--relay", "http://" + tunnelAddr, "--device", device, "--backend", "http://" + backend,
		"--protocol", "native", "--tunnel-version", strconv.Itoa(version), "--log-level", "info"}, out)
	if err != nil {
		return result{}, err
	}
	defer agent.Stop(5 * time.Second)
	base := "http://127.0.0.1:" + relayPort + "/client/" + device
	err = benchkit.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		if err := agent.Err(); err != nil {
			return err
		}
		return get(ctx, http.DefaultClient, base+"/small")
	})
	if err != nil {
		b, _ := os.ReadFile(logPath)
		return result{}, fmt.Errorf("agent v%d never answered: %w\n%s", version, err, b)
	}
	b, _ := os.ReadFile(logPath)
	if want := fmt.Sprintf("tunnel_version=%d", version); !strings.Contains(string(b), want) {
		return result{}, fmt.Errorf("agent did not connect with tunnel version %d:\n%s", version, b)
	}
	return measure(ctx, fmt.Sprintf("native tunnel v%d through the link", version), base, o, false)
}

// measure takes the small GETs and the download at base. Over a plain
// path each GET has a connection of its own, so that the figure includes
// everything a first request pays; through a relay the user's connection
// to the relay is local and the tunnel is already up.
func measure(ctx context.Context, name, base string, o options, fresh bool) (result, error) {
	r := result{name: name}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: fresh, DisableCompression: true}}
	defer client.CloseIdleConnections()
	if err := get(ctx, client, base+"/small"); err != nil { // warm: the relay's stream pool, the agent's dial
		return r, err
	}
	var times []time.Duration
	for range o.requests {
		start := time.Now()
		if err := get(ctx, client, base+"/small"); err != nil {
			return r, err
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	r.getP50, r.getMax = times[len(times)/2], times[len(times)-1]

	n := int64(o.downloadMB) * 1_000_000
	start := time.Now()
	resp, err := client.Get(fmt.Sprintf("%s/bytes?n=%d", base, n))
	if err != nil {
		return r, err
	}
	got, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return r, fmt.Errorf("%s: download: %w", name, err)
	}
	if got != n {
		return r, fmt.Errorf("%s: download: %d bytes of %d", name, got, n)
	}
	r.download = float64(n) / 1e6 / time.Since(start).Seconds()
	return r, nil
}

func report(results []result, o options) {
	rtt := 2 * o.latency
	plain := results[0]
	fmt.Printf("\n| path | small GET p50 | round trips of the link (%v) | slowest GET | %d MB download | ÷ plain |\n|---|---|---|---|---|---|\n", rtt, o.downloadMB)
	for _, r := range results {
		fmt.Printf("| %s | %.1f ms | %.2f | %.1f ms | %.2f MB/s | %.0f %% |\n", r.name,
			ms(r.getP50), float64(r.getP50)/float64(rtt), ms(r.getMax), r.download, 100*r.download/plain.download)
	}
	fmt.Printf("\nload average at the end %s\n", loadavg())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func get(ctx context.Context, c *http.Client, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return nil
}

// startBackend serves /small (2 bytes) and /bytes?n=N on a loopback port.
func startBackend() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "n: a byte count", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		chunk := make([]byte, 64<<10)
		for n > 0 {
			k := min(n, int64(len(chunk)))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	go (&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
	return ln, nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
