package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// RelayStatus is a relay as this member sees it: its record, with
// freshness computed at read time, never stored. The operator API's JSON
// of it is package control's Relay.
type RelayStatus struct {
	ID              string
	Hostname        string
	Region          string
	Addresses       []string
	Version         string
	Healthy         bool
	Fresh           bool
	Draining        bool
	Stopping        bool
	LastSeenAt      time.Time
	EnrolledAt      time.Time
	StartedAt       time.Time
	ForwardSessions int
	MaxForward      int
	AgentSessions   int
	AttachedDevices int
	// SecretFingerprint names the fleet secret the relay signs with,
	// SecretAccepted those it accepts, SecretSource "fleet" or "file", as
	// its last heartbeat reported them.
	SecretFingerprint string
	SecretAccepted    []string
	SecretSource      string
}

// Device states.
const (
	StateOnline  = "online"  // agents attached to a fresh relay
	StateOffline = "offline" // no agent attached
	StateStale   = "stale"   // attached to a relay that stopped beating
)

// DeviceStatus is a device's directory entry as this member sees it. The
// operator API's JSON of it is package control's Device.
type DeviceStatus struct {
	Name       string
	RelayID    string
	AttachedAt time.Time
	Agents     int
	Protocol   string
	Fresh      bool
	State      string
	UpdatedAt  time.Time
	Standby    string // the relay keeping a standby tunnel for it, "" for none
}

// DeviceLink is the relay side of a device's path, as an admin sees it.
type DeviceLink struct {
	DeviceStatus
	Relay *RelayStatus // nil when the relay is no longer known
}

// Relays returns every known relay, including those that stopped beating,
// sorted by id.
func (m *Member) Relays() []RelayStatus {
	v := m.view(time.Now())
	rs := m.relays.All()
	out := make([]RelayStatus, 0, len(rs))
	for _, r := range rs {
		out = append(out, m.relayStatus(r, v, m.loads.of(r.ID)))
	}
	slices.SortFunc(out, func(a, b RelayStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Relay returns the relay with the given id.
func (m *Member) Relay(id string) (RelayStatus, error) {
	r, ok := m.relays.Get(id)
	if !ok {
		return RelayStatus{}, fmt.Errorf("relay %q: %w", id, ErrNotFound)
	}
	return m.relayStatus(r, m.view(time.Now()), m.loads.of(id)), nil
}

func (m *Member) relayStatus(r Relay, v view, attached int) RelayStatus {
	return RelayStatus{
		ID: r.ID, Hostname: r.Hostname, Region: r.Region, Addresses: nonNil(r.Addresses),
		Version: r.Version, Healthy: r.Healthy, Fresh: v.fresh(r.LastSeenAt), Draining: r.Draining, Stopping: r.Stopping,
		LastSeenAt: r.LastSeenAt, EnrolledAt: r.EnrolledAt, StartedAt: r.StartedAt,
		ForwardSessions: r.ForwardSessions, MaxForward: r.MaxForward,
		AgentSessions: r.AgentSessions, AttachedDevices: attached,
		SecretFingerprint: r.SecretFingerprint, SecretAccepted: nonNil(r.SecretAccepted), SecretSource: r.SecretSource,
	}
}

// LostWindow returns the configured lost window.
func (m *Member) LostWindow() time.Duration { return m.cfg.LostWindow }

// SetRelayDraining sets relay id's drain flag: the only way to undrain. It
// records an event when the flag changes.
func (m *Member) SetRelayDraining(ctx context.Context, id string, draining bool) error {
	changed, err := setDraining(ctx, m.relaysKV, id, draining)
	if err != nil || !changed {
		return err
	}
	if draining {
		m.Record(Event{Type: EventRelayDraining, RelayID: id, Message: fmt.Sprintf("relay %s set to drain by an operator", id)})
	} else {
		m.Record(Event{Type: EventRelayUndrained, RelayID: id, Message: fmt.Sprintf("relay %s undrained by an operator", id)})
	}
	return nil
}

// Devices returns every device in the directory, sorted by name.
func (m *Member) Devices() []DeviceStatus {
	v := m.view(time.Now())
	ds := m.devices.All()
	out := make([]DeviceStatus, 0, len(ds))
	for _, d := range ds {
		out = append(out, m.deviceStatus(d, v))
	}
	slices.SortFunc(out, func(a, b DeviceStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Device returns the directory entry of the named device and its relay.
func (m *Member) Device(name string) (DeviceLink, error) {
	d, ok := m.devices.Get(deviceKey(name))
	if !ok {
		return DeviceLink{}, fmt.Errorf("device %q: %w", name, ErrNotFound)
	}
	link := DeviceLink{DeviceStatus: m.deviceStatus(d, m.view(time.Now()))}
	if r, err := m.Relay(d.RelayID); err == nil {
		link.Relay = &r
	}
	return link, nil
}

func (m *Member) deviceStatus(d Attachment, v view) DeviceStatus {
	s := DeviceStatus{
		Name: d.Device, RelayID: d.RelayID, AttachedAt: d.AttachedAt, Agents: d.Agents,
		Protocol: d.Protocol, UpdatedAt: d.UpdatedAt, State: StateOffline, Standby: d.Standby,
	}
	if d.Agents > 0 {
		r, ok := m.relays.Get(d.RelayID)
		s.Fresh = ok && v.fresh(r.LastSeenAt)
		s.State = StateStale
		if s.Fresh {
			s.State = StateOnline
		}
	}
	return s
}

// Events returns the last n events (at most MaxEventsList), oldest first.
func (m *Member) Events(ctx context.Context, n int) ([]Event, error) {
	return m.events.list(ctx, n)
}

// FollowEvents calls fn with each event recorded from now on, until ctx
// ends or fn fails.
func (m *Member) FollowEvents(ctx context.Context, fn func(Event) error) error {
	return m.events.follow(ctx, fn)
}

// Status is a summary of the fleet as this relay sees it. The operator
// API's JSON of it is package control's Status.
type Status struct {
	RelayID        string
	NATSConnected  bool
	LeaseHeld      bool
	ShouldDrain    bool
	Relays         int
	FreshRelays    int
	DrainingRelays int
	Devices        int
	OnlineDevices  int
	// DevicesHere counts the devices the directory places on this relay
	// with agents: what an autoscaler weighs a relay by.
	DevicesHere   int
	EventsDropped int64
	// ViewAgeMS is how far behind now this relay's view of the relay set
	// is: 0 while its own heartbeats come back through its watch, growing
	// while NATS is away or takes no writes. Freshness is judged at the
	// moment the view was current (docs/design/fleet-state.md).
	ViewAgeMS int64
}

// Status summarises the fleet as this relay sees it.
func (m *Member) Status() Status {
	s := Status{
		RelayID: m.cfg.RelayID, NATSConnected: m.st.Connected() && m.reachable.Load(),
		LeaseHeld: m.leaseHeld.Load(), ShouldDrain: m.shouldDrain.Load(),
		EventsDropped: m.events.dropped.Load(),
	}
	// Counted in place: a scrape of /metrics asks for this, and the sorted
	// lists of Relays and Devices would cost it a copy of the directory.
	t := time.Now()
	v := m.view(t)
	s.ViewAgeMS = t.Sub(v.at).Milliseconds()
	fresh := map[string]bool{}
	m.relays.Range(func(r Relay) bool {
		s.Relays++
		fresh[r.ID] = v.fresh(r.LastSeenAt)
		if fresh[r.ID] {
			s.FreshRelays++
		}
		if r.Draining {
			s.DrainingRelays++
		}
		return true
	})
	m.devices.Range(func(d Attachment) bool {
		s.Devices++
		if d.Agents > 0 && fresh[d.RelayID] {
			s.OnlineDevices++
		}
		if d.Agents > 0 && d.RelayID == m.cfg.RelayID {
			s.DevicesHere++
		}
		return true
	})
	return s
}
