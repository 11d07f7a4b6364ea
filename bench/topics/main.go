// Command topics measures a relay's broadcast topics: one writer at a
// steady rate to many websocket readers of one topic on one relay
// process. It reports the delivery lag (writer's send to a reader's
// receipt, one clock: writer and readers run in this process), the
// messages readers lost, the relay's CPU per delivered GB and the bytes
// the writer (the device's side) sent.
//
//	go run ./bench/topics -readers 300,1000 -rate 30 -size 32768 -duration 10s
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
)

func main() {
	readers := flag.String("readers", "300,1000", "reader counts to measure, comma-separated, one run each")
	rate := flag.Int("rate", 30, "messages the writer sends per second")
	size := flag.Int("size", 32<<10, "bytes per message")
	duration := flag.Duration("duration", 10*time.Second, "how long the writer writes in each run")
	bin := flag.String("bin", "", "switchboard binary (default: build one)")
	flag.Parse()
	dir, err := os.MkdirTemp("", "switchboard-topics-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if *bin, err = benchkit.Binary(*bin, dir); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("load average at start: %s\n", loadavg())
	fmt.Printf("| readers | msg/s × size | out MB/s | lag p50 | lag p99 | lag max | lost | cut | relay CPU s per GB | writer sent MB | delivered MB |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range strings.Split(*readers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			log.Fatalf("-readers %q: give positive numbers", *readers)
		}
		r, err := run(*bin, filepath.Join(dir, "run-"+s), n, *rate, *size, *duration)
		if err != nil {
			log.Fatalf("%d readers: %v", n, err)
		}
		fmt.Println(r)
	}
	fmt.Printf("load average at end: %s\n", loadavg())
}

// result is one run's figures.
type result struct {
	readers, rate, size int
	seconds             float64
	lags                []time.Duration
	lost, cut           int64
	cpu                 time.Duration
	sent, delivered     int64
}

func (r result) String() string {
	slices.Sort(r.lags)
	q := func(p float64) string {
		if len(r.lags) == 0 {
			return "-"
		}
		return r.lags[min(len(r.lags)-1, int(p*float64(len(r.lags))))].Round(10 * time.Microsecond).String()
	}
	gb := float64(r.delivered) / 1e9
	return fmt.Sprintf("| %d | %d × %d KiB | %.0f | %s | %s | %s | %d | %d | %.2f | %.1f | %.0f |",
		r.readers, r.rate, r.size>>10, float64(r.delivered)/1e6/r.seconds, q(0.5), q(0.99), q(1), r.lost, r.cut,
		r.cpu.Seconds()/gb, float64(r.sent)/1e6, float64(r.delivered)/1e6)
}

func run(bin, dir string, readers, rate, size int, duration time.Duration) (result, error) {
	res := result{readers: readers, rate: rate, size: size}
	port, admin := benchkit.FreePort(), benchkit.FreePort()
	relay := exec.Command(bin, "serve", "--listen", "127.0.0.1:"+port, "--admin-listen", "127.0.0.1:"+admin,
		"--data", dir, "--allow-anonymous-users", "--log-level", "warn")
	relay.Stderr = os.Stderr
	if err := relay.Start(); err != nil {
		return res, err
	}
	defer func() {
		relay.Process.Kill()
		relay.Wait()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := benchkit.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error { return ok("http://127.0.0.1:" + admin + "/readyz") }); err != nil {
		return res, err
	}
	url := "ws://127.0.0.1:" + port + "/topic/bench/video"

	// The readers: each checks the sequence and records every lag.
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		lags      []time.Duration
		lost, cut atomic.Int64
		delivered atomic.Int64
	)
	conns := make([]*websocket.Conn, readers)
	for i := range conns {
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			return res, fmt.Errorf("reader %d: %w", i, err)
		}
		c.SetReadLimit(int64(size) + 1024)
		conns[i] = c
	}
	if err := benchkit.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		if got := benchkit.Gauge("http://127.0.0.1:"+admin+"/metrics", `switchboard_topic_readers{device="bench",reader="user",topic="video"}`); got != float64(readers) {
			return fmt.Errorf("%v readers joined of %d", got, readers)
		}
		return nil
	}); err != nil {
		return res, err
	}
	for _, c := range conns {
		wg.Go(func() {
			defer c.CloseNow()
			var mine []time.Duration
			next := uint64(0)
			head := make([]byte, 16)
			for {
				// Read the head, count the rest: no allocation per message,
				// so that the readers' own garbage does not weigh on the figures.
				_, rd, err := c.Reader(ctx)
				if err == nil {
					_, err = io.ReadFull(rd, head)
				}
				if err != nil {
					if websocket.CloseStatus(err) == websocket.StatusTryAgainLater {
						cut.Add(1)
					}
					break
				}
				at := time.Now()
				seq, sent := binary.BigEndian.Uint64(head), int64(binary.BigEndian.Uint64(head[8:]))
				if seq == ^uint64(0) {
					break // the writer's last message
				}
				rest, err := io.Copy(io.Discard, rd)
				if err != nil {
					break
				}
				lost.Add(int64(seq - next))
				next = seq + 1
				delivered.Add(16 + rest)
				mine = append(mine, at.Sub(time.Unix(0, sent)))
			}
			mu.Lock()
			lags = append(lags, mine...)
			mu.Unlock()
		})
	}

	w, _, err := websocket.Dial(ctx, url+"?mode=write", nil)
	if err != nil {
		return res, fmt.Errorf("writer: %w", err)
	}
	defer w.CloseNow()
	cpu0, err := procCPU(relay.Process.Pid)
	if err != nil {
		return res, err
	}
	start := time.Now()
	msg := make([]byte, size)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for seq := uint64(0); time.Since(start) < duration; seq++ {
		<-tick.C
		binary.BigEndian.PutUint64(msg, seq)
		binary.BigEndian.PutUint64(msg[8:], uint64(time.Now().UnixNano()))
		if err := w.Write(ctx, websocket.MessageBinary, msg); err != nil {
			return res, fmt.Errorf("write: %w", err)
		}
		res.sent += int64(len(msg))
	}
	tick.Stop()
	binary.BigEndian.PutUint64(msg, ^uint64(0))
	if err := w.Write(ctx, websocket.MessageBinary, msg[:16]); err != nil {
		return res, err
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		return res, errors.New("readers did not finish within 30 s of the last message")
	}
	res.seconds = time.Since(start).Seconds()
	cpu1, err := procCPU(relay.Process.Pid)
	if err != nil {
		return res, err
	}
	res.cpu = cpu1 - cpu0
	res.lags, res.lost, res.cut, res.delivered = lags, lost.Load(), cut.Load(), delivered.Load()
	return res, nil
}

func ok(u string) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// procCPU returns the user and system CPU time of process pid.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command (in parentheses, which may hold spaces):
	// utime is field 14 and stime 15 of the line.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 13 {
		return 0, errors.New("short /proc stat")
	}
	u, _ := strconv.ParseInt(fields[11], 10, 64)
	s, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(u+s) * (time.Second / 100), nil
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}
