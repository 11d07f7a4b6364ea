package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Keys of the rolling update in BucketFleet.
const (
	keyRollEnabled = "roll_enabled" // "true" when the fleet's owner allows rolls
	keyRoll        = "roll"         // the roll in progress, as RollState
)

// Phases of a relay in a roll.
const (
	RollHold      = "hold"      // held out of routing, emptying
	RollUpdating  = "updating"  // the operator's update step runs
	RollReturning = "returning" // waiting for the relay to come back
)

// RollState is a rolling update in progress, kept in the fleet state so that
// an interrupted roll can be resumed from any machine.
type RollState struct {
	StartedAt time.Time `json:"started_at"`
	By        string    `json:"by"`    // who started it, for people
	Order     []string  `json:"order"` // relay ids, in the order they are rolled
	Done      []string  `json:"done"`  // relay ids rolled and released
	Current   string    `json:"current,omitempty"`
	Phase     string    `json:"phase,omitempty"`
	// PrevStartedAt is when the current relay's process had started before
	// its update: it is back once it reports another start.
	PrevStartedAt time.Time `json:"prev_started_at,omitzero"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// RollEnabled reports whether the fleet's owner allows rolling updates.
func (m *Member) RollEnabled(ctx context.Context) (bool, error) {
	e, err := m.fleetKV.Get(ctx, keyRollEnabled)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return string(e.Value()) == "true", nil
}

// SetRollEnabled allows or forbids rolling updates for the whole fleet.
func (m *Member) SetRollEnabled(ctx context.Context, on bool) error {
	_, err := m.fleetKV.Put(ctx, keyRollEnabled, []byte(fmt.Sprint(on)))
	return err
}

// Roll returns the roll in progress, or nil.
func (m *Member) Roll(ctx context.Context) (*RollState, error) {
	e, err := m.fleetKV.Get(ctx, keyRoll)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s RollState
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return nil, fmt.Errorf("the stored roll is malformed: %w", err)
	}
	return &s, nil
}

// SaveRoll records the roll in progress.
func (m *Member) SaveRoll(ctx context.Context, s RollState) error {
	s.UpdatedAt = now()
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	_, err = m.fleetKV.Put(ctx, keyRoll, data)
	return err
}

// ClearRoll forgets the roll: it finished.
func (m *Member) ClearRoll(ctx context.Context) error {
	err := m.fleetKV.Delete(ctx, keyRoll)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}
