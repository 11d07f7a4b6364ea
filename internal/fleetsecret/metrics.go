package fleetsecret

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	mismatchDesc = prometheus.NewDesc("switchboard_fleet_secret_mismatch",
		"1 for each fresh relay that runs another fleet secret than the fleet (its forwards to and from the others are refused), 0 for the others.",
		[]string{"relay"}, nil)
	fingerprintsDesc = prometheus.NewDesc("switchboard_fleet_secret_fingerprints",
		"Distinct fleet secrets the fresh relays sign with: 1 in a fleet in parity.", nil, nil)
)

// RegisterMetrics registers the gauges of secret parity, from one Parity
// per scrape.
func (k *Keeper) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(&collector{k: k})
}

type collector struct{ k *Keeper }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mismatchDesc
	ch <- fingerprintsDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	p := c.k.Parity()
	for _, id := range p.checked {
		v := 0.0
		if slices.Contains(p.Odd, id) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(mismatchDesc, prometheus.GaugeValue, v, id)
	}
	ch <- prometheus.MustNewConstMetric(fingerprintsDesc, prometheus.GaugeValue, float64(p.SigningFingerprints))
}
