package control

import (
	"time"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/fleetsecret"
	"github.com/switchboard-relay/switchboard/internal/ports"
)

// The types below are the JSON of the operator API (/api/v1) and of
// 'switchboard ctl -o json', which prints what the API answered: the
// contract docs/cli-json.md documents for scripts. Their field names,
// types and meanings change only with a migration note; fields may be
// added. They are filled from the fleet's internal views at the edge, in
// the handlers, so that a change inside package fleet cannot change them:
// testdata/api holds every answer, compared byte for byte.
//
// Conventions: times are RFC 3339 in UTC, the zero time for one that never
// happened; lists are [] when empty, never null.

// Relay is a relay of the fleet: GET /api/v1/relays (every relay known,
// those that stopped beating too, sorted by id) and /api/v1/relays/{id}.
type Relay struct {
	ID        string   `json:"id"`        // rl- and 8 hex digits
	Hostname  string   `json:"hostname"`  // the relay's host name
	Region    string   `json:"region"`    // its --region, "" when none
	Addresses []string `json:"addresses"` // URLs other relays and agents reach it at
	Version   string   `json:"version"`   // its build version
	// Healthy is the relay's own view of its health, from its last beat.
	Healthy bool `json:"healthy"`
	// Fresh: its last heartbeat is recent enough; a relay that is not
	// fresh gets no new devices and is presumed down. Computed when read.
	Fresh bool `json:"fresh"`
	// Draining: an operator drained it; sticky until undrained.
	Draining bool `json:"draining"`
	// Stopping: it is shutting down; its next life beats without it.
	Stopping   bool      `json:"stopping"`
	LastSeenAt time.Time `json:"last_seen_at"` // its last heartbeat
	EnrolledAt time.Time `json:"enrolled_at"`  // when it first joined the fleet
	StartedAt  time.Time `json:"started_at"`   // when its process started, by its clock
	// ForwardSessions counts the devices it has agents for, MaxForward is
	// its ceiling, AgentSessions its agent connections, as it reported on
	// its last beat; AttachedDevices counts the devices the directory
	// places on it with an agent.
	ForwardSessions int `json:"forward_sessions"`
	MaxForward      int `json:"max_forward"`
	AgentSessions   int `json:"agent_sessions"`
	AttachedDevices int `json:"attached_devices"`
	// SecretFingerprint names the fleet secret it signs with,
	// SecretAccepted every one it accepts (the signing one first), and
	// SecretSource where they come from: "fleet" or "file".
	SecretFingerprint string   `json:"secret_fingerprint"`
	SecretAccepted    []string `json:"secret_accepted"`
	SecretSource      string   `json:"secret_source"`
}

func relayFrom(r fleet.RelayStatus) Relay {
	return Relay{
		ID: r.ID, Hostname: r.Hostname, Region: r.Region, Addresses: nonNil(r.Addresses), Version: r.Version,
		Healthy: r.Healthy, Fresh: r.Fresh, Draining: r.Draining, Stopping: r.Stopping,
		LastSeenAt: r.LastSeenAt, EnrolledAt: r.EnrolledAt, StartedAt: r.StartedAt,
		ForwardSessions: r.ForwardSessions, MaxForward: r.MaxForward, AgentSessions: r.AgentSessions, AttachedDevices: r.AttachedDevices,
		SecretFingerprint: r.SecretFingerprint, SecretAccepted: nonNil(r.SecretAccepted), SecretSource: r.SecretSource,
	}
}

func relaysFrom(rs []fleet.RelayStatus) []Relay {
	out := make([]Relay, 0, len(rs))
	for _, r := range rs {
		out = append(out, relayFrom(r))
	}
	return out
}

// Device states.
const (
	StateOnline  = fleet.StateOnline  // agents attached to a fresh relay
	StateOffline = fleet.StateOffline // no agent attached
	StateStale   = fleet.StateStale   // agents attached to a relay that stopped beating
)

// Device is a device's directory entry as an admin sees it: GET
// /api/v1/devices, sorted by name.
type Device struct {
	Name string `json:"name"`
	// RelayID is the relay its agents are, or were last, attached to.
	RelayID string `json:"relay_id"`
	// AttachedAt changes only when the device moves to another relay.
	AttachedAt time.Time `json:"attached_at"`
	// Agents counts its agent connections there; 0 is detached.
	Agents int `json:"agents"`
	// Protocol is "native", "longpoll" or "native+longpoll".
	Protocol string `json:"protocol"`
	// Fresh: it has agents and their relay is fresh.
	Fresh bool `json:"fresh"`
	// State is StateOnline, StateStale or StateOffline.
	State     string    `json:"state"`
	UpdatedAt time.Time `json:"updated_at"` // the entry's last change
	// Standby is the relay keeping a standby tunnel for it, which the
	// device moves to when its relay is vetoed or drains; absent for none.
	Standby string `json:"standby,omitempty"`
}

func deviceFrom(d fleet.DeviceStatus) Device {
	return Device{Name: d.Name, RelayID: d.RelayID, AttachedAt: d.AttachedAt, Agents: d.Agents,
		Protocol: d.Protocol, Fresh: d.Fresh, State: d.State, UpdatedAt: d.UpdatedAt, Standby: d.Standby}
}

func devicesFrom(ds []fleet.DeviceStatus) []Device {
	out := make([]Device, 0, len(ds))
	for _, d := range ds {
		out = append(out, deviceFrom(d))
	}
	return out
}

// DeviceLink is one device and the relay that holds it, as an admin sees
// them: GET /api/v1/devices/{name}.
type DeviceLink struct {
	Device
	// Relay is the device's relay as GET /api/v1/relays shows it; null
	// when that relay is no longer in the fleet.
	Relay *Relay `json:"relay"`
}

func deviceLinkFrom(l fleet.DeviceLink) DeviceLink {
	out := DeviceLink{Device: deviceFrom(l.DeviceStatus)}
	if l.Relay != nil {
		r := relayFrom(*l.Relay)
		out.Relay = &r
	}
	return out
}

// Event is one entry of the fleet's event log: GET /api/v1/events (an
// array, oldest first) and ?follow=1 (one object per line).
type Event struct {
	// Seq is its position in the event log: one more per event.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Type says what happened ("relay.draining", …); new types may come.
	Type    string `json:"type"`
	RelayID string `json:"relay_id,omitempty"` // the relay concerned
	From    string `json:"from,omitempty"`     // a moved device's previous relay
	Device  string `json:"device,omitempty"`   // the device concerned
	By      string `json:"by,omitempty"`       // the relay that recorded it
	// Message is the event in words, for people: not to be parsed.
	Message string `json:"message"`
	// DurationMS is a measured time, such as how long a move took.
	DurationMS float64 `json:"duration_ms,omitempty"`
}

func eventFrom(e fleet.Event) Event {
	return Event{Seq: e.Seq, Time: e.Time, Type: e.Type, RelayID: e.RelayID, From: e.From,
		Device: e.Device, By: e.By, Message: e.Message, DurationMS: e.DurationMS}
}

func eventsFrom(es []fleet.Event) []Event {
	out := make([]Event, 0, len(es))
	for _, e := range es {
		out = append(out, eventFrom(e))
	}
	return out
}

// Status is the fleet as the relay answering sees it: GET /api/v1/status.
type Status struct {
	RelayID string `json:"relay_id"` // the relay answering
	// NATSConnected: it reaches NATS; when false the counts may be old.
	NATSConnected bool `json:"nats_connected"`
	// LeaseHeld: it holds the housekeeping lease.
	LeaseHeld bool `json:"housekeeping_lease"`
	// ShouldDrain: the relay answering is drained.
	ShouldDrain    bool `json:"draining"`
	Relays         int  `json:"relays"`          // relays known, fresh or not
	FreshRelays    int  `json:"fresh_relays"`    // of those, the fresh ones
	DrainingRelays int  `json:"draining_relays"` // of those, the drained ones
	Devices        int  `json:"devices"`         // devices in the directory
	OnlineDevices  int  `json:"online_devices"`  // of those, with agents on a fresh relay
	// DevicesHere counts the devices the directory places on the relay
	// answering, with agents.
	DevicesHere int `json:"devices_here"`
	// EventsDropped counts the events it could not record since it started.
	EventsDropped int64 `json:"events_dropped"`
	// ViewAgeMS is how far behind now its view of the relay set is.
	ViewAgeMS int64 `json:"view_age_ms"`
	// SecretFingerprint names the fleet secret it signs with, and
	// SecretSource says where it comes from ("fleet" or "file").
	SecretFingerprint string `json:"secret_fingerprint"`
	SecretSource      string `json:"secret_source"`
	// SecretMismatch lists the fresh relays that run another fleet secret
	// than the fleet.
	SecretMismatch []string `json:"secret_mismatch"`
}

// statusFrom is the status of the fleet s and of the secret sec (nil: none).
func statusFrom(s fleet.Status, sec FleetSecret) Status {
	out := Status{RelayID: s.RelayID, NATSConnected: s.NATSConnected, LeaseHeld: s.LeaseHeld, ShouldDrain: s.ShouldDrain,
		Relays: s.Relays, FreshRelays: s.FreshRelays, DrainingRelays: s.DrainingRelays,
		Devices: s.Devices, OnlineDevices: s.OnlineDevices, DevicesHere: s.DevicesHere,
		EventsDropped: s.EventsDropped, ViewAgeMS: s.ViewAgeMS, SecretMismatch: []string{}}
	if sec != nil {
		out.SecretFingerprint, _, out.SecretSource = sec.Report()
		out.SecretMismatch = nonNil(sec.Parity().Odd)
	}
	return out
}

// Phases of a relay in a roll.
const (
	RollHold      = fleet.RollHold      // held out of routing, emptying
	RollUpdating  = fleet.RollUpdating  // the operator's update step runs
	RollReturning = fleet.RollReturning // waiting for the relay to come back
)

// RollState is a rolling update in progress: GET /api/v1/roll's "state",
// and the body of PUT /api/v1/roll/state. It is kept in the fleet state so
// that an interrupted roll resumes from any machine.
type RollState struct {
	StartedAt time.Time `json:"started_at"`
	By        string    `json:"by"`    // who started it, for people
	Order     []string  `json:"order"` // relay ids, in the order they are rolled
	Done      []string  `json:"done"`  // relay ids rolled and released
	Current   string    `json:"current,omitempty"`
	Phase     string    `json:"phase,omitempty"` // RollHold, RollUpdating or RollReturning
	// PrevStartedAt is when the current relay's process had started before
	// its update: it is back once it reports another start.
	PrevStartedAt time.Time `json:"prev_started_at,omitzero"`
	UpdatedAt     time.Time `json:"updated_at"`
}

func rollStateFrom(s fleet.RollState) RollState {
	return RollState{StartedAt: s.StartedAt, By: s.By, Order: s.Order, Done: s.Done, Current: s.Current,
		Phase: s.Phase, PrevStartedAt: s.PrevStartedAt, UpdatedAt: s.UpdatedAt}
}

func (s RollState) toFleet() fleet.RollState {
	return fleet.RollState{StartedAt: s.StartedAt, By: s.By, Order: s.Order, Done: s.Done, Current: s.Current,
		Phase: s.Phase, PrevStartedAt: s.PrevStartedAt, UpdatedAt: s.UpdatedAt}
}

// Sources of a relay's fleet secret.
const (
	SecretSourceFleet = fleetsecret.SourceFleet // the fleet's stored secret, followed live
	SecretSourceFile  = fleetsecret.SourceFile  // --fleet-secret-file
)

// Phases of a rotation of the fleet secret.
const (
	RotationAccept = fleetsecret.RotationAccept // the new secret is accepted only
	RotationSign   = fleetsecret.RotationSign   // the new secret signs; the old one is still accepted
)

// Bases of a SecretParity.
const (
	ParityRecord   = fleetsecret.ParityRecord   // the stored secret's signing one
	ParityMajority = fleetsecret.ParityMajority // what most fresh relays sign with, when all run from files
)

// SecretStatus is the fleet secret as the relay answering sees it, never a
// secret itself, only fingerprints: GET /api/v1/secret.
type SecretStatus struct {
	RelayID string `json:"relay_id"` // the relay answering
	// Source is where it gets its secret: SecretSourceFleet or SecretSourceFile.
	Source string `json:"source"`
	// Record is the stored secret; null when none is stored.
	Record *SecretRecord `json:"record"`
	Parity SecretParity  `json:"parity"`
	// Relays are every relay's secrets, sorted by id.
	Relays []RelaySecret `json:"relays"`
}

// SecretRecord is the stored fleet secret, without its secrets: the
// "record" of GET /api/v1/secret, and the answer of each rotation step.
type SecretRecord struct {
	Generation uint64       `json:"generation"` // counts the record's changes
	Signing    string       `json:"signing"`    // the fingerprint relays sign with
	Secrets    []SecretInfo `json:"secrets"`    // every accepted secret
	// Rotation is the rotation in progress; null when there is none.
	Rotation  *Rotation `json:"rotation"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
}

// SecretInfo is one accepted secret of a SecretRecord.
type SecretInfo struct {
	Fingerprint string    `json:"fingerprint"`
	AddedAt     time.Time `json:"added_at"`
	// RetireAt is when an old secret kept for its grace is dropped;
	// absent for the others.
	RetireAt time.Time `json:"retire_at,omitzero"`
}

// Rotation is a rotation of the fleet secret in progress.
type Rotation struct {
	Phase     string    `json:"phase"` // RotationAccept or RotationSign
	From      string    `json:"from"`  // the fingerprint of the secret that signed before
	To        string    `json:"to"`    // the fingerprint of the new one
	StartedAt time.Time `json:"started_at"`
	By        string    `json:"by"`
}

// SecretParity is how the fleet secrets of the fresh relays compare.
type SecretParity struct {
	// Expected is the fingerprint every relay should sign with, by Basis
	// (ParityRecord or ParityMajority); "" when no fresh relay reports one.
	Expected string `json:"expected"`
	Basis    string `json:"basis"`
	// Odd are the fresh relays that run another secret, sorted.
	Odd []string `json:"odd"`
	// SigningFingerprints counts the distinct secrets fresh relays sign with.
	SigningFingerprints int `json:"signing_fingerprints"`
}

// RelaySecret is what one relay reports of its fleet secret.
type RelaySecret struct {
	ID                string   `json:"id"`
	Fresh             bool     `json:"fresh"`
	SecretSource      string   `json:"secret_source"`
	SecretFingerprint string   `json:"secret_fingerprint"`
	SecretAccepted    []string `json:"secret_accepted"`
	// Odd: it runs another secret than the fleet (SecretParity.Odd).
	Odd bool `json:"odd"`
}

func secretStatusFrom(s fleetsecret.Status) SecretStatus {
	out := SecretStatus{RelayID: s.RelayID, Source: s.Source, Relays: make([]RelaySecret, 0, len(s.Relays)),
		Parity: SecretParity{Expected: s.Parity.Expected, Basis: s.Parity.Basis, Odd: nonNil(s.Parity.Odd), SigningFingerprints: s.Parity.SigningFingerprints}}
	if s.Record != nil {
		rec := secretRecordFrom(*s.Record)
		out.Record = &rec
	}
	for _, r := range s.Relays {
		out.Relays = append(out.Relays, RelaySecret{ID: r.ID, Fresh: r.Fresh, SecretSource: r.SecretSource,
			SecretFingerprint: r.SecretFingerprint, SecretAccepted: nonNil(r.SecretAccepted), Odd: r.Odd})
	}
	return out
}

func secretRecordFrom(r fleetsecret.RecordInfo) SecretRecord {
	out := SecretRecord{Generation: r.Generation, Signing: r.Signing, Secrets: make([]SecretInfo, 0, len(r.Secrets)),
		UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}
	for _, s := range r.Secrets {
		out.Secrets = append(out.Secrets, SecretInfo{Fingerprint: s.Fingerprint, AddedAt: s.AddedAt, RetireAt: s.RetireAt})
	}
	if rot := r.Rotation; rot != nil {
		out.Rotation = &Rotation{Phase: rot.Phase, From: rot.From, To: rot.To, StartedAt: rot.StartedAt, By: rot.By}
	}
	return out
}

// PortRequest maps a port of every relay: POST /api/v1/ports.
type PortRequest struct {
	Port    int    `json:"port"`              // 1 to 65535
	Network string `json:"network,omitempty"` // "tcp" (the default) or "udp"
	Target  string `json:"target"`            // DEVICE/SERVICE
	// Allow, if set, lists the source addresses or CIDR prefixes that may
	// connect; others are closed at once.
	Allow []string `json:"allow,omitempty"`
	// MaxConnections bounds the connections (UDP: flows) open at once
	// through one relay; 0 means no bound.
	MaxConnections int `json:"max_connections,omitempty"`
	// ProxyProtocol sends the service a PROXY protocol v2 header first
	// (tcp only).
	ProxyProtocol bool `json:"proxy_protocol,omitempty"`
}

// PortMapping is a mapped port: GET /api/v1/ports (by network and port),
// the answer of POST and of DELETE /api/v1/ports/{network}/{port}.
type PortMapping struct {
	Port           int       `json:"port"`
	Network        string    `json:"network"` // "tcp" or "udp"
	Target         string    `json:"target"`  // DEVICE/SERVICE
	Allow          []string  `json:"allow"`   // [] when every source may connect
	MaxConnections int       `json:"max_connections"`
	ProxyProtocol  bool      `json:"proxy_protocol"`
	CreatedAt      time.Time `json:"created_at"`
	CreatedBy      string    `json:"created_by"` // the admin token's name, "" when none
}

func portMappingFrom(m ports.Mapping) PortMapping {
	return PortMapping{Port: m.Port, Network: m.Network, Target: m.Target, Allow: nonNil(m.Allow),
		MaxConnections: m.MaxConns, ProxyProtocol: m.ProxyProtocol, CreatedAt: m.CreatedAt, CreatedBy: m.CreatedBy}
}
