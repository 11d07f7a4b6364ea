package tcpconns

import "github.com/prometheus/client_golang/prometheus"

// metrics are the tracker's, labelled by kind (connect, port) and name (a
// connect service's name, bounded by MaxServiceNames, or a mapped port's
// number): never by device, whose names are unbounded.
type metrics struct {
	opened   *prometheus.CounterVec
	refused  *prometheus.CounterVec
	openNow  *prometheus.GaugeVec
	bytes    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics() metrics {
	kn := []string{"kind", "name"}
	return metrics{
		opened: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchboard_tcp_connections_total",
			Help: "TCP connections carried to devices' services, by kind (connect, port) and service or port."}, kn),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchboard_tcp_refusals_total",
			Help: "TCP connections refused before anything was carried, by kind, service or port, and reason."}, append(kn, "reason")),
		openNow: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "switchboard_tcp_connections_open",
			Help: "TCP connections open now, by kind and service or port."}, kn),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "switchboard_tcp_bytes_total",
			Help: "Bytes carried by TCP connections that ended, by kind, service or port, and direction (to_device, from_device)."}, append(kn, "direction")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "switchboard_tcp_connection_duration_seconds",
			Help:    "How long TCP connections lasted, by kind and service or port.",
			Buckets: []float64{0.01, 0.1, 1, 10, 60, 600, 3600, 6 * 3600, 24 * 3600}}, kn),
	}
}

func (m metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.opened, m.refused, m.openNow, m.bytes, m.duration)
}
