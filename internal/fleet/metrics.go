package fleet

import "github.com/prometheus/client_golang/prometheus"

// RegisterMetrics registers gauges of the fleet as this relay sees it. One
// Status is taken per scrape, whatever the number of gauges.
func (m *Member) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(&statusCollector{m: m})
}

// statusGauge is one metric drawn from a Status.
type statusGauge struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(Status) float64
}

func newGauge(name, help string, kind prometheus.ValueType, value func(Status) float64) statusGauge {
	return statusGauge{desc: prometheus.NewDesc("switchboard_fleet_"+name, help, nil, nil), kind: kind, value: value}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var statusGauges = []statusGauge{
	newGauge("relays", "Relays in the fleet state, fresh or not.", prometheus.GaugeValue, func(s Status) float64 { return float64(s.Relays) }),
	newGauge("relays_fresh", "Relays whose last heartbeat is fresh.", prometheus.GaugeValue, func(s Status) float64 { return float64(s.FreshRelays) }),
	newGauge("relays_draining", "Relays marked draining.", prometheus.GaugeValue, func(s Status) float64 { return float64(s.DrainingRelays) }),
	newGauge("devices", "Devices in the directory.", prometheus.GaugeValue, func(s Status) float64 { return float64(s.Devices) }),
	newGauge("devices_online", "Devices with agents on a fresh relay.", prometheus.GaugeValue, func(s Status) float64 { return float64(s.OnlineDevices) }),
	newGauge("devices_here", "Devices the directory places on this relay, with agents.", prometheus.GaugeValue, func(s Status) float64 { return float64(s.DevicesHere) }),
	newGauge("nats_connected", "1 while this relay reaches the fleet state in NATS.", prometheus.GaugeValue, func(s Status) float64 { return b2f(s.NATSConnected) }),
	newGauge("view_age_seconds", "How far behind now this relay's view of the relay set is: 0 while its own heartbeats come back through it; freshness is judged at that moment.", prometheus.GaugeValue, func(s Status) float64 { return float64(s.ViewAgeMS) / 1000 }),
	newGauge("housekeeping_lease", "1 while this relay holds the housekeeping lease.", prometheus.GaugeValue, func(s Status) float64 { return b2f(s.LeaseHeld) }),
	newGauge("draining", "1 while this relay is marked draining.", prometheus.GaugeValue, func(s Status) float64 { return b2f(s.ShouldDrain) }),
	newGauge("events_dropped_total", "Events dropped because NATS was away and the queue was full.", prometheus.CounterValue, func(s Status) float64 { return float64(s.EventsDropped) }),
}

// statusCollector reports statusGauges from one Status per collection.
type statusCollector struct{ m *Member }

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range statusGauges {
		ch <- g.desc
	}
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.Status()
	for _, g := range statusGauges {
		ch <- prometheus.MustNewConstMetric(g.desc, g.kind, g.value(s))
	}
}
