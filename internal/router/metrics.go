package router

import "github.com/prometheus/client_golang/prometheus"

// Outcomes of a forward, the outcome label of
// switchboard_router_forwards_total.
const (
	ForwardOK    = "ok"
	ForwardError = "error"
)

// ForwardMetrics counts the forwards of user requests to the relay holding
// their device: switchboard_router_forwards_total{outcome}. Its Observe is
// a Fleet's OnForward.
type ForwardMetrics struct {
	forwards *prometheus.CounterVec
}

// NewForwardMetrics returns the forward counter, registered in reg (nil
// registers nowhere), every series at zero from the start.
func NewForwardMetrics(reg prometheus.Registerer) *ForwardMetrics {
	m := &ForwardMetrics{forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "switchboard_router_forwards_total",
		Help: "User requests forwarded one hop to the relay holding their device, by outcome.",
	}, []string{"outcome"})}
	m.forwards.WithLabelValues(ForwardOK)
	m.forwards.WithLabelValues(ForwardError)
	if reg != nil {
		reg.MustRegister(m.forwards)
	}
	return m
}

// Forwarded counts one forward to relayID that ended with err.
func (m *ForwardMetrics) Forwarded(relayID string, err error) {
	if err != nil {
		m.forwards.WithLabelValues(ForwardError).Inc()
		return
	}
	m.forwards.WithLabelValues(ForwardOK).Inc()
}
