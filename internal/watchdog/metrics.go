package watchdog

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Causes of a veto, the cause label of switchboard_watchdog_veto_seconds.
const (
	CauseProbes   = "probes"    // Misses probes in a row failed with an error
	CauseSilence  = "silence"   // no probe answered for Silence
	CauseDataPath = "data_path" // the data path found it refusing connections (Veto)
)

// metrics are the watchdog's; see docs/metrics.md.
type metrics struct {
	vetoes *prometheus.HistogramVec
	late   prometheus.Counter
	pulses prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{vetoes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "switchboard_watchdog_veto_seconds",
		Help:    "Time from a peer's first failed probe, or for a silent peer its last answer, to its veto (0 for a refused connection or the data path).",
		Buckets: []float64{0, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5},
	}, []string{"cause"}),
		late: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchboard_watchdog_behind_total",
			Help: "Times the watchdog ran more than half an interval late and put off judging its peers' silences: their answers may have been waiting unread.",
		}),
		pulses: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchboard_watchdog_pulses",
			Help: "Peers heard over an open pulse now; the others are probed over HTTP.",
		}),
	}
	// Every series from the start, so that dashboards and alerts see
	// zeros rather than nothing.
	m.vetoes.WithLabelValues(CauseProbes)
	m.vetoes.WithLabelValues(CauseSilence)
	m.vetoes.WithLabelValues(CauseDataPath)
	if reg != nil {
		reg.MustRegister(m.vetoes, m.late, m.pulses)
	}
	return m
}

func (m metrics) behind() { m.late.Inc() }

func (m metrics) vetoed(cause string, after time.Duration) {
	m.vetoes.WithLabelValues(cause).Observe(after.Seconds())
}
