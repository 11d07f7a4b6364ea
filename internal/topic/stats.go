package topic

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is what a relay shows of one topic: in ctl and on the admin page.
type Stats struct {
	Device         string `json:"device"`
	Name           string `json:"name"`
	Readers        int    `json:"readers"`       // users' connections reading here
	RelayReaders   int    `json:"relay_readers"` // other relays fed from here
	Writers        int    `json:"writers"`
	Fed            bool   `json:"fed"` // fed from the relay holding the device
	Published      int64  `json:"published"`
	PublishedBytes int64  `json:"published_bytes"`
	Delivered      int64  `json:"delivered"`
	DeliveredBytes int64  `json:"delivered_bytes"`
	RelayDelivered int64  `json:"relay_delivered"` // messages delivered to other relays
	RelayBytes     int64  `json:"relay_bytes"`
	Dropped        int64  `json:"dropped"`
	Cut            int64  `json:"cut"` // readers cut for lagging
}

// Stats returns the topics on this relay, by device and name.
func (h *Hub) Stats() []Stats {
	h.mu.Lock()
	all := make([]*Topic, 0, len(h.topics))
	for _, t := range h.topics {
		all = append(all, t)
	}
	h.mu.Unlock()
	out := make([]Stats, 0, len(all))
	for _, t := range all {
		out = append(out, t.stats())
	}
	slices.SortFunc(out, func(a, b Stats) int {
		if c := strings.Compare(a.Device, b.Device); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

func (t *Topic) stats() Stats {
	t.mu.Lock()
	s := Stats{Device: t.key.Device, Name: t.key.Name, Readers: t.users, RelayReaders: len(t.readers) - t.users, Writers: len(t.writers), Fed: t.fed}
	t.mu.Unlock()
	s.Published, s.PublishedBytes = t.published.Load(), t.publishedBytes.Load()
	s.Delivered, s.DeliveredBytes = t.toUsers.Load(), t.toUsersBytes.Load()
	s.RelayDelivered, s.RelayBytes = t.toRelays.Load(), t.toRelaysBytes.Load()
	s.Dropped, s.Cut = t.dropped.Load(), t.cut.Load()
	return s
}

// Metric descriptions.
var (
	descReaders   = prometheus.NewDesc("switchboard_topic_readers", "Connections reading a topic on this relay, by who reads: users, or other relays fed from here.", []string{"device", "topic", "reader"}, nil)
	descWriters   = prometheus.NewDesc("switchboard_topic_writers", "Connections writing to a topic on this relay.", []string{"device", "topic"}, nil)
	descDropped   = prometheus.NewDesc("switchboard_topic_dropped_messages_total", "Whole messages readers of a topic lost because they fell behind, while the topic is on this relay.", []string{"device", "topic"}, nil)
	descMessages  = prometheus.NewDesc("switchboard_topic_messages_total", "Messages of every topic: taken in (from writers or the holder) and delivered, to users or other relays.", []string{"direction"}, nil)
	descBytes     = prometheus.NewDesc("switchboard_topic_bytes_total", "Bytes of messages of every topic: taken in (from writers or the holder) and delivered, to users or other relays.", []string{"direction"}, nil)
	descAllDrops  = prometheus.NewDesc("switchboard_topic_dropped_all_messages_total", "Whole messages lost by slow readers of every topic.", nil, nil)
	descCutTotal  = prometheus.NewDesc("switchboard_topic_cut_readers_total", "Readers cut because they fell behind by more than the lag limit.", nil, nil)
	topicMetrics  = []*prometheus.Desc{descReaders, descWriters, descDropped, descMessages, descBytes, descAllDrops, descCutTotal}
	directionsIn  = "in"
	directionUser = "to_users"
	directionPeer = "to_relays"
)

// RegisterMetrics registers the hub's metrics, switchboard_topic_…, with reg.
func (h *Hub) RegisterMetrics(reg prometheus.Registerer) { reg.MustRegister(collector{h}) }

// collector reads the hub at every scrape.
type collector struct{ h *Hub }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range topicMetrics {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	h := c.h
	h.mu.Lock()
	sum := h.totals
	h.mu.Unlock()
	for _, s := range h.Stats() {
		ch <- prometheus.MustNewConstMetric(descReaders, prometheus.GaugeValue, float64(s.Readers), s.Device, s.Name, "user")
		ch <- prometheus.MustNewConstMetric(descReaders, prometheus.GaugeValue, float64(s.RelayReaders), s.Device, s.Name, "relay")
		ch <- prometheus.MustNewConstMetric(descWriters, prometheus.GaugeValue, float64(s.Writers), s.Device, s.Name)
		ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(s.Dropped), s.Device, s.Name)
		sum.published += s.Published
		sum.publishedBytes += s.PublishedBytes
		sum.toUsers += s.Delivered
		sum.toUsersBytes += s.DeliveredBytes
		sum.toRelays += s.RelayDelivered
		sum.toRelaysBytes += s.RelayBytes
		sum.dropped += s.Dropped
		sum.cut += s.Cut
	}
	ch <- prometheus.MustNewConstMetric(descMessages, prometheus.CounterValue, float64(sum.published), directionsIn)
	ch <- prometheus.MustNewConstMetric(descMessages, prometheus.CounterValue, float64(sum.toUsers), directionUser)
	ch <- prometheus.MustNewConstMetric(descMessages, prometheus.CounterValue, float64(sum.toRelays), directionPeer)
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(sum.publishedBytes), directionsIn)
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(sum.toUsersBytes), directionUser)
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(sum.toRelaysBytes), directionPeer)
	ch <- prometheus.MustNewConstMetric(descAllDrops, prometheus.CounterValue, float64(sum.dropped))
	ch <- prometheus.MustNewConstMetric(descCutTotal, prometheus.CounterValue, float64(sum.cut))
}
