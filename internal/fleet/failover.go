package fleet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FailoverMetrics measures how long devices took to move onto this relay:
// switchboard_fleet_failover_seconds, from an agent losing its relay to its
// device attaching here. Its Observe is a Config's OnMove.
type FailoverMetrics struct {
	moves prometheus.Histogram
}

// NewFailoverMetrics returns the histogram, registered in reg (nil
// registers nowhere).
func NewFailoverMetrics(reg prometheus.Registerer) *FailoverMetrics {
	m := &FailoverMetrics{moves: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "switchboard_fleet_failover_seconds",
		Help:    "Time from an agent losing its relay to its device attaching here (moves onto this relay).",
		Buckets: []float64{0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1, 1.5, 2, 3, 5, 10},
	})}
	if reg != nil {
		reg.MustRegister(m.moves)
	}
	return m
}

// Observe records one move of device from relay from that took took; a
// move whose agent did not say how long it was away (0) is not counted.
func (m *FailoverMetrics) Observe(device, from string, took time.Duration) {
	if took > 0 {
		m.moves.Observe(took.Seconds())
	}
}
