package broker

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the broker's Prometheus metrics.
type metrics struct {
	devices      prometheus.Gauge
	pending      prometheus.Gauge
	active       prometheus.Gauge
	pollsWaiting prometheus.Gauge
	requests     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		devices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchboard_broker_devices", Help: "Device names with a long-poll agent seen recently."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchboard_broker_pending_requests", Help: "User requests waiting for a long-poll agent to take them."}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchboard_broker_active_requests", Help: "User requests in flight through long-poll agents."}),
		pollsWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchboard_broker_polls_waiting", Help: "Agent polls waiting for a user request."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchboard_broker_requests_total", Help: "User requests through long-poll agents, by outcome."},
			[]string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.devices, m.pending, m.active, m.pollsWaiting, m.requests)
	}
	return m
}

// outcome counts one finished round trip.
func (m *metrics) outcome(err error) {
	var be *Error
	label := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrNoAgent):
		label = "no_agent"
	case errors.Is(err, ErrTimeout):
		label = "timeout"
	case errors.Is(err, ErrDraining):
		label = "draining"
	case errors.Is(err, context.Canceled):
		label = "canceled"
	case errors.As(err, &be):
		label = "rejected"
	default:
		label = "error"
	}
	m.requests.WithLabelValues(label).Inc()
}
