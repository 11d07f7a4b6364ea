package fleet

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// A relay that the directory names for a device learns where the device's
// agent went before the directory does: it sent the agent on itself (it
// drains, or must not keep the device), or the relay that took the agent
// tells it at once over SubjectTaken. The relay that took the agent writes
// the move, and until NATS takes that write (a cluster electing its
// leaders again after nodes came back refuses writes for seconds) every
// mirror still names the old relay. Route on the old relay sends the
// device's requests after the agent meanwhile, instead of waiting there
// for an agent that is not coming back; it stops once the directory
// records the device anew (AttachedAt), and NoteTaken ends it when an
// agent of the device is taken there again.

// SubjectTaken, followed by "." and a relay's id, carries notices to that
// relay that another took an arriving agent of a device the directory
// names it for; each relay listens on its own. A relay that predates it
// never hears the notice, and waits for the directory as before.
const SubjectTaken = "switchboard.fleet.taken"

// takenMsg tells RelayID, which the directory names for Device, that By
// took an agent of the device.
type takenMsg struct {
	Device  string `json:"device"`
	RelayID string `json:"relay_id"`
	By      string `json:"by"`
}

// sentAgent is the relay an agent of a device went to, and when.
type sentAgent struct {
	relayID string
	at      time.Time
}

// maxSent bounds the devices remembered as gone: a relay remembers at most
// the devices it held, and forgets each once the directory moves on.
const maxSent = 100_000

// NoteSent records that an agent of device went to the relay relayID: this
// relay sent it there, or that relay said it took it. It notes nothing
// unless the directory names this relay for the device: elsewhere Route
// follows the directory anyway.
func (m *Member) NoteSent(device, relayID string) {
	d, ok := m.devices.Get(deviceKey(device))
	if !ok || d.RelayID != m.cfg.RelayID || relayID == "" || relayID == m.cfg.RelayID {
		return
	}
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	if _, had := m.sent[device]; had || len(m.sent) < maxSent {
		m.sent[device] = sentAgent{relayID: relayID, at: now()}
	}
}

// NoteTaken records that this relay takes an arriving agent of device: it
// forgets where an agent of it went before, and tells the relay the
// directory names for the device, if another, that the agent is here.
func (m *Member) NoteTaken(device string) {
	m.sentMu.Lock()
	delete(m.sent, device)
	m.sentMu.Unlock()
	d, ok := m.devices.Get(deviceKey(device))
	if !ok || d.RelayID == m.cfg.RelayID || !ValidRelayID(d.RelayID) {
		return
	}
	data, err := json.Marshal(takenMsg{Device: device, RelayID: d.RelayID, By: m.cfg.RelayID})
	if err == nil {
		err = m.st.Conn().Publish(SubjectTaken+"."+d.RelayID, data)
	}
	if err != nil {
		m.log.Debug("could not tell a relay that its device's agent is here", logkey.Device, device, logkey.RelayID, d.RelayID, logkey.Err, err)
	}
}

// subscribeTaken notes the agents that other relays took of devices the
// directory names this relay for. The subscription survives reconnects.
func (m *Member) subscribeTaken() (*nats.Subscription, error) {
	return m.st.Conn().Subscribe(SubjectTaken+"."+m.cfg.RelayID, func(msg *nats.Msg) {
		var tm takenMsg
		if err := json.Unmarshal(msg.Data, &tm); err != nil || tm.Device == "" || tm.RelayID != m.cfg.RelayID {
			return
		}
		m.NoteSent(tm.Device, tm.By)
	})
}

// sentTo returns the relay an agent of device went to, marked Final, while
// d, the directory's entry naming this relay, was attached before the
// agent went (the device did not come back since) and that relay answers
// in v.
func (m *Member) sentTo(device string, d Attachment, v view, vetoed func(id string) bool, exclude string) (Target, bool) {
	m.sentMu.Lock()
	s, ok := m.sent[device]
	if ok && d.AttachedAt.After(s.at) {
		delete(m.sent, device)
		ok = false
	}
	m.sentMu.Unlock()
	if !ok {
		return Target{}, false
	}
	r, found := m.relays.Get(s.relayID)
	if !found || !v.state(r, vetoed, exclude).Answers() {
		return Target{}, false
	}
	t := m.target(r)
	t.Final = true
	return t, true
}

// forgetSent forgets the devices gone elsewhere that the directory no
// longer names this relay for: Route follows the directory for them again.
func (m *Member) forgetSent() {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	for device := range m.sent {
		if d, ok := m.devices.Get(deviceKey(device)); !ok || d.RelayID != m.cfg.RelayID {
			delete(m.sent, device)
		}
	}
}
