// Package fleet keeps the fleet's shared record in NATS JetStream: which
// relays exist and when each last beat, which are draining, which relay
// holds which device, and what happened (events). Every node runs a Member:
// it enrols the relay, beats, publishes the devices it holds, mirrors the
// relay set and the device directory in memory from watches on their
// buckets, and takes its turn at housekeeping under a lease. The layout is
// described in docs/design/fleet-state.md.
package fleet

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"time"
	"unique"
)

// The JetStream buckets and stream of the fleet state.
const (
	BucketRelays  = "switchboard_relays"  // relay id → Relay
	BucketDevices = "switchboard_devices" // device key → Attachment
	BucketLeases  = "switchboard_leases"  // lease name → lease
	StreamEvents  = "SWITCHBOARD_EVENTS"  // one message per Event
	// SubjectEvents prefixes the subject of each event: the event type follows.
	SubjectEvents = "switchboard.events."
)

// Errors of the fleet operations.
var (
	// ErrNotFound means no relay has the given id, or no device the given name.
	ErrNotFound = errors.New("not found")
	// ErrConflict means a compare-and-set kept losing to other writers.
	ErrConflict = errors.New("too many concurrent updates")
)

// Relay is a relay's record in BucketRelays, as JSON, under its id. The
// relay writes it on every heartbeat; only Draining is also written by
// operators (SetRelayDraining), and a heartbeat can set it but never clear it.
type Relay struct {
	ID         string    `json:"id"`
	Hostname   string    `json:"hostname"`
	Region     string    `json:"region"`
	Addresses  []string  `json:"addresses"` // advertised URLs other relays and agents use
	Version    string    `json:"version"`
	Healthy    bool      `json:"healthy"` // self-reported; read it with freshness
	Draining   bool      `json:"draining"`
	Stopping   bool      `json:"stopping"` // shutting down; reported, not sticky
	EnrolledAt time.Time `json:"enrolled_at"`
	StartedAt  time.Time `json:"started_at"`   // when the relay process started
	LastSeenAt time.Time `json:"last_seen_at"` // the last heartbeat
	// ForwardSessions counts the devices this relay holds agents for: each is
	// a session the relay forwards users to. MaxForward is its ceiling,
	// enforced when a device is assigned.
	ForwardSessions int `json:"forward_sessions"`
	MaxForward      int `json:"max_forward"`
	// AgentSessions counts agent connections: native tunnels and long-poll
	// agents. A device may have several.
	AgentSessions int `json:"agent_sessions"`
	// BeatIntervalMS is the relay's heartbeat interval, so that readers can
	// tell how late a beat is.
	BeatIntervalMS int64 `json:"beat_interval_ms"`
	// SecretFingerprint names the fleet secret the relay signs forwards
	// with, SecretAccepted every one it accepts (the signing one first), and
	// SecretSource where it gets them: "fleet" (the stored record) or "file"
	// (--fleet-secret-file).
	SecretFingerprint string   `json:"secret_fingerprint,omitempty"`
	SecretAccepted    []string `json:"secret_accepted,omitempty"`
	SecretSource      string   `json:"secret_source,omitempty"`
}

// Attachment is a device's entry in BucketDevices, as JSON: the relay that
// holds it and since when.
type Attachment struct {
	Device  string `json:"device"`
	RelayID string `json:"relay_id"`
	// AttachedAt changes only when the device moves to another relay; a
	// repeated attachment to the same relay keeps it.
	AttachedAt time.Time `json:"attached_at"`
	// Agents counts the device's agent connections on RelayID; 0 means the
	// device is detached (its last agent left) but remembers its relay.
	Agents int `json:"agents"`
	// Protocol is "native", "longpoll" or "native+longpoll".
	Protocol  string    `json:"protocol"`
	UpdatedAt time.Time `json:"updated_at"`
	// Standby is the id of a relay that keeps a standby tunnel for the
	// device, to which the fleet moves it when RelayID is vetoed or
	// drains; written and cleared by that relay (hot-standby.md).
	Standby string `json:"standby,omitempty"`
}

// Event types.
const (
	EventRelayEnrolled  = "relay.enrolled"
	EventRelayDraining  = "relay.draining"
	EventRelayStopping  = "relay.stopping"
	EventRelayUndrained = "relay.undrained"
	EventRelayStale     = "relay.stale"
	EventRelayFresh     = "relay.fresh"
	EventRelayLost      = "relay.lost"
	EventRelayReaped    = "relay.reaped"
	EventDeviceAttached = "device.attached"
	EventDeviceMoved    = "device.moved"
	EventDeviceDetached = "device.detached"
	EventDeviceReaped   = "device.reaped"
	EventLeaseTaken     = "housekeeping.lease"
	EventSecretMismatch = "secret.mismatch" // a relay runs another fleet secret than the fleet
	EventSecretParity   = "secret.parity"   // a relay no longer does
	EventSecretRotation = "secret.rotation" // a step of a rotation, or an old secret dropped
)

// EventRelayDrainForced follows EventRelayDraining when an operator forced
// a drain that the guards refused; it says where devices go.
const EventRelayDrainForced = "relay.drain_forced"

// Event is one entry of the fleet's event log (StreamEvents).
type Event struct {
	Seq     uint64    `json:"seq"` // the stream sequence, filled when read
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	RelayID string    `json:"relay_id,omitempty"` // the relay concerned
	From    string    `json:"from,omitempty"`     // a device's previous relay
	Device  string    `json:"device,omitempty"`
	By      string    `json:"by,omitempty"` // the relay that recorded it
	Message string    `json:"message"`
	// DurationMS is a measured time, such as how long a move took.
	DurationMS float64 `json:"duration_ms,omitempty"`
}

// deviceKey is the key of device in BucketDevices: the name itself when it
// is a valid key, else "=" and its hex (device names never contain '=').
func deviceKey(device string) string {
	if device != "" && device[0] != '.' && device[len(device)-1] != '.' && !strings.Contains(device, "..") {
		valid := true
		for i := range len(device) {
			c := device[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
				valid = false
				break
			}
		}
		if valid {
			return device
		}
	}
	return "=" + hex.EncodeToString([]byte(device))
}

// now is the time recorded in the fleet state, in UTC to the microsecond.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// decodeAttachment decodes a directory record. Every relay mirrors the
// whole directory, so what each record repeats is kept once: the
// device's name is the record's key, and relay ids and protocols, a few
// values shared by all records, are canonical copies (unique.Make).
func decodeAttachment(key string, data []byte) (Attachment, error) {
	var a Attachment
	if err := json.Unmarshal(data, &a); err != nil {
		return a, err
	}
	if a.Device == key {
		a.Device = key
	}
	a.RelayID = canonical(a.RelayID)
	a.Protocol = canonical(a.Protocol)
	a.Standby = canonical(a.Standby)
	return a, nil
}

// canonical returns the one shared copy of s.
func canonical(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}
