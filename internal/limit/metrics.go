package limit

import "github.com/prometheus/client_golang/prometheus"

// metrics describes the limiter's metrics. Each carries the constant label
// scope (Config.Scope), so that several limiters can share a registry.
type metrics struct {
	refusals, penalties, tracked *prometheus.Desc
}

func newMetrics(scope string) metrics {
	labels := prometheus.Labels{"scope": scope}
	return metrics{
		refusals: prometheus.NewDesc("switchboard_limit_refusals_total",
			"Authentication attempts refused (429) because the client address failed too often.", nil, labels),
		penalties: prometheus.NewDesc("switchboard_limit_penalties_total",
			"Refusal windows opened by a failed authentication past the free ones.", nil, labels),
		tracked: prometheus.NewDesc("switchboard_limit_tracked_addresses",
			"Client addresses (IPv6: /64 prefixes) with recent failed authentications remembered.", nil, labels),
	}
}

var _ prometheus.Collector = (*Limiter)(nil)

// Describe implements prometheus.Collector.
func (l *Limiter) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.metrics.refusals
	ch <- l.metrics.penalties
	ch <- l.metrics.tracked
}

// Collect implements prometheus.Collector.
func (l *Limiter) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(l.metrics.refusals, prometheus.CounterValue, float64(l.refusals.Load()))
	ch <- prometheus.MustNewConstMetric(l.metrics.penalties, prometheus.CounterValue, float64(l.penalties.Load()))
	ch <- prometheus.MustNewConstMetric(l.metrics.tracked, prometheus.GaugeValue, float64(l.Tracked()))
}

// RegisterMetrics registers the limiter's metrics with reg.
func (l *Limiter) RegisterMetrics(reg prometheus.Registerer) { reg.MustRegister(l) }
