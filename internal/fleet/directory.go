package fleet

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Presence is what one relay holds of one device right now.
type Presence struct {
	Agents   int    // agent connections for the device on this relay
	Protocol string // "native", "longpoll" or "native+longpoll"
}

// attachResult says what an attach changed.
type attachResult struct {
	entry   Attachment // the entry as written, or as found when unchanged
	written bool       // the entry was written
	moved   bool       // the device was recorded on another relay before
	from    string     // that relay
	isNew   bool       // the device had no entry, or was detached
}

// attach records that relayID holds device. attached_at changes only when
// the device moves to another relay (or had no entry).
func attach(ctx context.Context, kv jetstream.KeyValue, relayID, device string, p Presence, hint *record[Attachment]) (attachResult, error) {
	var res attachResult
	entry, err := updateFrom(ctx, kv, deviceKey(device), hint, func(cur Attachment, found bool) (Attachment, bool, error) {
		res = attachResult{written: true}
		t := now()
		switch {
		case !found:
			res.isNew = true
			return Attachment{Device: device, RelayID: relayID, AttachedAt: t, Agents: p.Agents, Protocol: p.Protocol, UpdatedAt: t}, true, nil
		case cur.RelayID != relayID:
			res.moved, res.from = true, cur.RelayID
			return Attachment{Device: device, RelayID: relayID, AttachedAt: t, Agents: p.Agents, Protocol: p.Protocol, UpdatedAt: t}, true, nil
		case cur.Agents == p.Agents && cur.Protocol == p.Protocol:
			res.written = false
			return cur, false, nil
		default:
			res.isNew = cur.Agents == 0
			cur.Agents, cur.Protocol, cur.UpdatedAt = p.Agents, p.Protocol, t
			return cur, true, nil
		}
	})
	if err != nil {
		return attachResult{}, fmt.Errorf("attach %s: %w", device, err)
	}
	res.entry = entry
	return res, nil
}

// detach records that relayID no longer has agents for device. It is
// honoured only while the device is still recorded on relayID; the entry
// keeps its relay, so that the device returns there (stickiness).
func detach(ctx context.Context, kv jetstream.KeyValue, relayID, device string, hint *record[Attachment]) (bool, error) {
	var done bool
	_, err := updateFrom(ctx, kv, deviceKey(device), hint, func(cur Attachment, found bool) (Attachment, bool, error) {
		done = found && cur.RelayID == relayID && cur.Agents > 0
		if !done {
			return cur, false, nil
		}
		cur.Agents, cur.UpdatedAt = 0, now()
		return cur, true, nil
	})
	if err != nil {
		return false, fmt.Errorf("detach %s: %w", device, err)
	}
	return done, nil
}
