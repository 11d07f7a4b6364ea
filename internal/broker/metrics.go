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
	for _, o := range outcomes {
		m.requests.WithLabelValues(o) // every series from the start: zeros, not nothing
	}
	return m
}

// outcome counts one finished round trip.
func (m *metrics) outcome(err error) {
	m.requests.WithLabelValues(outcomeOf(err)).Inc()
}

// outcomes are the outcome labels of switchboard_broker_requests_total.
var outcomes = []string{"ok", "no_agent", "timeout", "draining", "canceled", "rejected", "error"}

// outcomeOf is the outcome label of a round trip that ended with err.
func outcomeOf(err error) string {
	var be *Error
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrNoAgent):
		return "no_agent"
	case errors.Is(err, ErrTimeout):
		return "timeout"
	case errors.Is(err, ErrDraining):
		return "draining"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &be):
		return "rejected"
	default:
		return "error"
	}
}
