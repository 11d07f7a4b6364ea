package fleet

import "github.com/prometheus/client_golang/prometheus"

// RegisterMetrics registers gauges of the fleet as this relay sees it.
func (m *Member) RegisterMetrics(reg prometheus.Registerer) {
	gauge := func(name, help string, f func(Status) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "switchboard", Subsystem: "fleet", Name: name, Help: help},
			func() float64 { return f(m.Status()) })
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	reg.MustRegister(
		gauge("relays", "Relays in the fleet state, fresh or not.", func(s Status) float64 { return float64(s.Relays) }),
		gauge("relays_fresh", "Relays whose last heartbeat is fresh.", func(s Status) float64 { return float64(s.FreshRelays) }),
		gauge("relays_draining", "Relays marked draining.", func(s Status) float64 { return float64(s.DrainingRelays) }),
		gauge("devices", "Devices in the directory.", func(s Status) float64 { return float64(s.Devices) }),
		gauge("devices_online", "Devices with agents on a fresh relay.", func(s Status) float64 { return float64(s.OnlineDevices) }),
		gauge("nats_connected", "1 while this relay reaches the fleet state in NATS.", func(s Status) float64 { return b2f(s.NATSConnected) }),
		gauge("housekeeping_lease", "1 while this relay holds the housekeeping lease.", func(s Status) float64 { return b2f(s.LeaseHeld) }),
		gauge("draining", "1 while this relay is marked draining.", func(s Status) float64 { return b2f(s.ShouldDrain) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "switchboard", Subsystem: "fleet", Name: "events_dropped_total",
			Help: "Events dropped because NATS was away and the queue was full."}, func() float64 { return float64(m.events.dropped.Load()) }),
	)
}
