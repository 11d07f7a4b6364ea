package watchdog

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Causes of a veto, the cause label of switchboard_watchdog_veto_seconds.
const (
	CauseProbes   = "probes"    // the peer missed Misses probes in a row
	CauseDataPath = "data_path" // the data path found it refusing connections (Veto)
)

// metrics are the watchdog's; see docs/metrics.md.
type metrics struct {
	vetoes *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{vetoes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "switchboard_watchdog_veto_seconds",
		Help:    "Time from a peer's first missed probe (or refused connection: 0) to its veto.",
		Buckets: []float64{0, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5},
	}, []string{"cause"})}
	// Every series from the start, so that dashboards and alerts see
	// zeros rather than nothing.
	m.vetoes.WithLabelValues(CauseProbes)
	m.vetoes.WithLabelValues(CauseDataPath)
	if reg != nil {
		reg.MustRegister(m.vetoes)
	}
	return m
}

func (m metrics) vetoed(cause string, after time.Duration) {
	m.vetoes.WithLabelValues(cause).Observe(after.Seconds())
}
