package fleet

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// SubjectCancel carries requests to drop a device's sessions; every relay
// listens on it.
const SubjectCancel = "switchboard.fleet.cancel"

// EventDeviceCancelled is recorded when an operator drops a device's sessions.
const EventDeviceCancelled = "device.cancelled"

// cancelMsg asks relays to drop every session of Device: all relays, or only
// RelayID when set.
type cancelMsg struct {
	Device  string `json:"device"`
	RelayID string `json:"relay_id,omitempty"`
	Reason  string `json:"reason"`
	// Moved marks a split-affinity drop: the device moved to another
	// relay; requests in flight here may finish.
	Moved bool `json:"moved,omitempty"`
	// SendBack asks RelayID instead to send the device's native agents
	// back through the front door, gently (see Member.SendBack). A relay
	// that predates the field drops the device as on a move, which sends
	// the agents back too.
	SendBack bool `json:"send_back,omitempty"`
	// Promoted marks a move to the relay that kept the device's standby
	// tunnel: the agent retires its tunnel here by itself, so RelayID
	// hands its tunnels over (Config.OnHandOver) rather than closing
	// them. A relay that predates the field drops the device as on a move.
	Promoted bool   `json:"promoted,omitempty"`
	By       string `json:"by"`
}

// subscribeCancels delivers cancel requests meant for this relay to
// Config.OnCancel. The subscription survives reconnects.
func (m *Member) subscribeCancels() (*nats.Subscription, error) {
	return m.st.Conn().Subscribe(SubjectCancel, func(msg *nats.Msg) {
		var c cancelMsg
		if err := json.Unmarshal(msg.Data, &c); err != nil || c.Device == "" {
			m.log.Warn("ignoring a malformed cancel request", logkey.Err, err)
			return
		}
		if c.RelayID != "" && c.RelayID != m.cfg.RelayID {
			return
		}
		if c.SendBack {
			m.cfg.OnSendBack(c.Device, c.By)
			return
		}
		if c.Moved && ValidRelayID(c.By) {
			// The device's agent is at By now, which this relay's
			// mirror of the directory may not show for a while (NATS
			// electing its leaders): Route sends its requests there.
			m.NoteSent(c.Device, c.By)
		}
		if c.Promoted && c.Moved && c.RelayID == m.cfg.RelayID {
			m.log.Info("handing a device over to its standby", logkey.Device, c.Device, logkey.By, c.By)
			m.cfg.OnHandOver(c.Device, c.By)
			return
		}
		m.log.Info("dropping a device's sessions", logkey.Device, c.Device, logkey.Reason, c.Reason, logkey.By, c.By)
		m.cfg.OnCancel(c.Device, c.Reason, c.Moved)
	})
}

// publishCancel sends c without waiting; a relay that misses it (NATS away)
// still learns of the move from the directory.
func (m *Member) publishCancel(c cancelMsg) {
	c.By = m.cfg.RelayID
	data, err := json.Marshal(c)
	if err == nil {
		err = m.st.Conn().Publish(SubjectCancel, data)
	}
	if err != nil {
		m.log.Debug("could not ask a relay to drop a device", logkey.Device, c.Device, logkey.RelayID, c.RelayID, logkey.Err, err)
	}
}

// SendBack asks relay holder to send device's native agents back through
// the front door they came in by: users of the device reach this relay
// through it, so the front door now sends the device here (a relay that
// came back after a failure gets its share back this way). It does not
// wait; a relay that misses it keeps the device, and users' requests take
// the forward hop.
func (m *Member) SendBack(device, holder string) {
	m.publishCancel(cancelMsg{Device: device, RelayID: holder, Reason: "its users reach relay " + m.cfg.RelayID, SendBack: true})
}

// CancelDevice asks every relay of the fleet to drop all sessions of device
// (agents' tunnels and polls, and the requests in flight through them); the
// agents reconnect. It returns once NATS has the request.
func (m *Member) CancelDevice(ctx context.Context, device, reason string) error {
	data, err := json.Marshal(cancelMsg{Device: device, Reason: reason, By: m.cfg.RelayID})
	if err != nil {
		return err
	}
	if err := m.st.Conn().Publish(SubjectCancel, data); err != nil {
		return fmt.Errorf("cancel %s: %w", device, err)
	}
	fctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := m.st.Conn().FlushWithContext(fctx); err != nil {
		return fmt.Errorf("cancel %s: %w", device, err)
	}
	m.Record(Event{Type: EventDeviceCancelled, Device: device, Message: fmt.Sprintf("device %s: every session dropped fleet-wide (%s)", device, reason)})
	return nil
}
