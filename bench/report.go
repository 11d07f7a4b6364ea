package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// report collects the columns of the results table.
type report struct {
	cfg     *config
	direct  results
	relays  []column // one per protocol measured
	skipped []string // "protocol: why"
	machine machine
	when    time.Time
	load    [2]string // /proc/loadavg's 1, 5 and 15 minute averages at start and end
}

// column is one protocol's results through the relay.
type column struct {
	protocol string
	res      results
	peer     bool // another relay, not a switchboard protocol
}

func newReport(cfg *config) *report {
	return &report{cfg: cfg, machine: readMachine(), when: time.Now(), load: [2]string{loadAvg()}}
}

// loadAvg returns the 1, 5 and 15 minute load averages: other work on the
// machine skews every figure, so the report shows them.
func loadAvg() string {
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

// loadLine says how busy the machine was.
func (r *report) loadLine() string {
	return fmt.Sprintf("load average (1/5/15 min): %s at start, %s at end", r.load[0], r.load[1])
}

// add records the results of "direct" or of a protocol.
func (r *report) add(name string, res results) {
	if name == "direct" {
		r.direct = res
		return
	}
	r.relays = append(r.relays, column{protocol: name, res: res})
}

// addPeer records the results of a peer.
func (r *report) addPeer(name string, res results) {
	r.relays = append(r.relays, column{protocol: name, res: res, peer: true})
}

func (r *report) skip(protocol, why string) {
	r.skipped = append(r.skipped, protocol+": "+why)
}

// metric is one row of the table.
type metric struct {
	test  string // the measurement it comes from
	name  string
	value func(results) string // the cell
	ratio func(relay, direct results) string
}

// cell renders the metric of res, or "failed".
func (m metric) cell(res results) string {
	if res.Failed[m.test] {
		return "failed"
	}
	return m.value(res)
}

// metrics returns the table's rows for cfg.
func metrics(cfg *config) []metric {
	latency := func(r results) series { return r.Latency }
	ws := func(r results) series { return r.WS }
	p50 := func(s series) time.Duration { return s.P50 }
	p99 := func(s series) time.Duration { return s.P99 }
	return []metric{
		durationRow(testLatency, "small GET latency p50", latency, p50),
		durationRow(testLatency, "small GET latency p99", latency, p99),
		{testLatency, "  p50 way there (client → backend)", msCell(func(r results) time.Duration { return r.ThereP50 }),
			func(relay, direct results) string { return fmtRatio(float64(relay.ThereP50), float64(direct.ThereP50)) }},
		{testLatency, "  p50 way back (backend → client)", msCell(func(r results) time.Duration { return r.BackP50 }),
			func(relay, direct results) string { return fmtRatio(float64(relay.BackP50), float64(direct.BackP50)) }},
		{testLatency, "  relay's own /healthz p50 (one hop, no agent)", func(r results) string {
			if r.HealthzP50 == 0 {
				return "—"
			}
			return fmtMS(r.HealthzP50)
		}, func(relay, direct results) string {
			if relay.HealthzP50 == 0 {
				return "—"
			}
			return fmtRatio(float64(relay.HealthzP50), float64(direct.Latency.P50))
		}},
		rateRow(testRPS, fmt.Sprintf("requests/s, %d connections, %v", cfg.Concurrency, cfg.Duration), "%.0f",
			func(r results) float64 { return r.RPS }),
		{testRPS, "relay CPU per request (requests/s test)", cpuCell(func(r results) time.Duration { return r.RelayCPUPerReq }), noRatio},
		{testRPS, "agent CPU per request (requests/s test)", cpuCell(func(r results) time.Duration { return r.AgentCPUPerReq }), noRatio},
		{testRPS, "backend CPU per request (requests/s test)", func(r results) string { return fmtMicros(r.BackendCPUPerReq) },
			func(relay, direct results) string {
				return fmtRatio(float64(relay.BackendCPUPerReq), float64(direct.BackendCPUPerReq))
			}},
		rateRow(testDownload, fmt.Sprintf("download %d MB, MB/s", cfg.DownloadMB), "%.1f",
			func(r results) float64 { return r.DownloadMBps }),
		rateRow(testUpload, fmt.Sprintf("upload %d MB, MB/s", cfg.UploadMB), "%.1f",
			func(r results) float64 { return r.UploadMBps }),
		durationRow(testWS, "websocket round trip p50", ws, p50),
		{testUpload, "relay RSS before upload", rssCell(func(r results) int64 { return r.RelayRSS.Before }), noRatio},
		{testUpload, "relay RSS peak during upload", rssCell(func(r results) int64 { return r.RelayRSS.Peak }), noRatio},
		{testUpload, "relay RSS growth during upload", rssCell(func(r results) int64 { return r.RelayRSS.Peak - r.RelayRSS.Before }),
			growthRatio(cfg, func(r results) rss { return r.RelayRSS })},
		{testUpload, "agent RSS growth during upload", rssCell(func(r results) int64 { return r.AgentRSS.Peak - r.AgentRSS.Before }),
			growthRatio(cfg, func(r results) rss { return r.AgentRSS })},
	}
}

// durationRow is a row of a percentile of a timed series.
func durationRow(test, name string, get func(results) series, pick func(series) time.Duration) metric {
	return metric{
		test:  test,
		name:  name,
		value: func(r results) string { return fmtSeries(get(r), pick(get(r))) },
		ratio: func(relay, direct results) string {
			return fmtRatio(float64(pick(get(relay))), float64(pick(get(direct))))
		},
	}
}

// rateRow is a row of a rate, printed with format.
func rateRow(test, name, format string, get func(results) float64) metric {
	return metric{
		test:  test,
		name:  name,
		value: func(r results) string { return fmt.Sprintf(format, get(r)) },
		ratio: func(relay, direct results) string { return fmtRatio(get(relay), get(direct)) },
	}
}

// msCell renders a duration in milliseconds.
func msCell(get func(results) time.Duration) func(results) string {
	return func(r results) string { return fmtMS(get(r)) }
}

// cpuCell renders a CPU time per request of a relay column in µs.
func cpuCell(get func(results) time.Duration) func(results) string {
	return func(r results) string {
		if r.RelayCPUPerReq == 0 && r.AgentCPUPerReq == 0 {
			return "—"
		}
		return fmtMicros(get(r))
	}
}

// fmtMicros renders a CPU time in µs.
func fmtMicros(d time.Duration) string {
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

// fmtSeries renders a duration of s in milliseconds, noting a series cut short.
func fmtSeries(s series, d time.Duration) string {
	out := fmtMS(d)
	if s.N < s.Want {
		out += fmt.Sprintf(" (n=%d of %d)", s.N, s.Want)
	}
	return out
}

func fmtMS(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms < 10 {
		return fmt.Sprintf("%.3f ms", ms)
	}
	return fmt.Sprintf("%.1f ms", ms)
}

// fmtRatio renders relay/direct, with the fraction 1/x when below one.
func fmtRatio(relay, direct float64) string {
	if direct == 0 {
		return "—"
	}
	q := relay / direct
	if q >= 1 {
		return fmt.Sprintf("%.1f×", q)
	}
	return fmt.Sprintf("%.3f× (1/%.0f)", q, 1/q)
}

// rssCell renders a byte count of a relay column in MB; direct has none.
func rssCell(get func(results) int64) func(results) string {
	return func(r results) string {
		if r.RelayRSS.Before == 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f MB", float64(get(r))/1e6)
	}
}

func noRatio(results, results) string { return "—" }

// growthRatio renders RSS growth as a multiple of the upload size.
func growthRatio(cfg *config, get func(results) rss) func(relay, direct results) string {
	return func(relay, _ results) string {
		g := get(relay)
		return fmt.Sprintf("%.2f× upload", float64(g.Peak-g.Before)/(float64(cfg.UploadMB)*1e6))
	}
}

// header returns the table's column names.
func (r *report) header() []string {
	h := []string{"metric", "direct"}
	for _, c := range r.relays {
		h = append(h, "relay ("+c.protocol+")", "ratio ("+c.protocol+")")
	}
	return h
}

// rows returns the table's cells.
func (r *report) rows() [][]string {
	var rows [][]string
	for _, m := range metrics(r.cfg) {
		if !slices.Contains(r.cfg.Tests, m.test) {
			continue
		}
		row := []string{m.name, m.cell(r.direct)}
		for _, c := range r.relays {
			ratio := "—"
			if !r.direct.Failed[m.test] && !c.res.Failed[m.test] {
				ratio = m.ratio(c.res, r.direct)
			}
			row = append(row, m.cell(c.res), ratio)
		}
		rows = append(rows, row)
	}
	return rows
}

// write prints the table to w and, when mdPath is set, writes it as markdown.
func (r *report) write(w io.Writer, mdPath string) error {
	r.load[1] = loadAvg()
	if err := r.writeText(w); err != nil {
		return fmt.Errorf("print results: %w", err)
	}
	if mdPath == "" {
		return nil
	}
	f, err := os.Create(mdPath)
	if err != nil {
		return fmt.Errorf("markdown: %w", err)
	}
	if err := r.writeMarkdown(f); err != nil {
		f.Close()
		return fmt.Errorf("markdown: %w", err)
	}
	return f.Close()
}

func (r *report) writeText(w io.Writer) error {
	fmt.Fprintf(w, "\n%s\n%s\n\n", r.machine, r.loadLine())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range append([][]string{r.header()}, r.rows()...) {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range r.notes() {
		fmt.Fprintln(w, n)
	}
	return nil
}

func (r *report) writeMarkdown(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "Run %s — %s; %s\n\n", r.when.UTC().Format(time.RFC3339), r.machine, r.loadLine())
	fmt.Fprintf(bw, "Command: `go run ./bench %s`\n\n", strings.Join(r.cfg.Args, " "))
	writeMDRow(bw, r.header())
	sep := make([]string, len(r.header()))
	for i := range sep {
		sep[i] = "---"
		if i > 0 {
			sep[i] = "---:"
		}
	}
	writeMDRow(bw, sep)
	for _, row := range r.rows() {
		writeMDRow(bw, row)
	}
	for _, n := range r.notes() {
		fmt.Fprintf(bw, "\n%s\n", n)
	}
	return bw.Flush()
}

// notes are the lines under the table: skipped protocols, agents that
// connected with another protocol than the one asked for, and what the
// floor's column is.
func (r *report) notes() []string {
	var notes []string
	for _, s := range r.skipped {
		notes = append(notes, "Skipped "+s+".")
	}
	for _, c := range r.relays {
		if c.peer {
			continue
		}
		if c.protocol != floorProtocol && !slices.Equal(c.res.ProtocolsSeen, []string{c.protocol}) {
			notes = append(notes, fmt.Sprintf("Warning: the %s agent's log shows it connected with %q: that column may not measure %s.", c.protocol, c.res.ProtocolsSeen, c.protocol))
		}
		if c.protocol == floorProtocol {
			notes = append(notes, "The floor column is two plain TCP forwarders in place of the relay and the agent: the same hops, bytes copied in user space, no HTTP (its \"relay\" and \"agent\" rows are the forwarders).")
		}
	}
	return notes
}

func writeMDRow(w io.Writer, cells []string) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
}

// machine describes where the run happened.
type machine struct {
	cpus      int
	cpuModel  string
	goVersion string
	kernel    string
	tree      string // the source tree's commit, and whether it had changes
}

func readMachine() machine {
	m := machine{cpus: runtime.NumCPU(), cpuModel: "unknown CPU", goVersion: runtime.Version(), kernel: "unknown kernel"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpuModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		m.goVersion = strings.TrimSpace(string(out))
	}
	m.tree = sourceTree()
	return m
}

// sourceTree names the commit the binaries were built from, noting
// uncommitted changes to tracked files; "unknown" outside a git checkout.
func sourceTree() string {
	head, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	tree := "commit " + strings.TrimSpace(string(head))
	if dirty, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(dirty) > 0 {
		tree += " with uncommitted changes"
	}
	return tree
}

func (m machine) String() string {
	return fmt.Sprintf("%d CPUs (%s), %s, %s, source %s", m.cpus, m.cpuModel, m.goVersion, m.kernel, m.tree)
}
