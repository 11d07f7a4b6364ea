package ports

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchboard-relay/switchboard/internal/kvmirror"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// Bucket is the NATS key-value bucket of the mappings.
const Bucket = "switchboard_ports"

// Store is the fleet's port mappings: written through NATS, read from a
// mirror that never waits for it.
type Store struct {
	kv     jetstream.KeyValue
	mirror *kvmirror.Mirror[Mapping]
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex // guards onChange
	onChange []func()
}

// OpenStore opens the mappings in kv and waits for their first read.
func OpenStore(ctx context.Context, kv jetstream.KeyValue, log *slog.Logger) (*Store, error) {
	s := &Store{kv: kv}
	s.mirror = kvmirror.New(kv, log.With(logkey.Component, "ports"), kvmirror.Config[Mapping]{OnChange: s.changed})
	rctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Go(func() { s.mirror.Run(rctx) })
	if err := s.mirror.Wait(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("ports: open bucket %s: %w", kv.Bucket(), err)
	}
	return s, nil
}

// Close stops mirroring.
func (s *Store) Close() {
	s.cancel()
	s.wg.Wait()
}

// OnChange calls fn (on the mirror's goroutine) after each change of the
// mappings. Register before the changes that matter.
func (s *Store) OnChange(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onChange = append(s.onChange, fn)
}

func (s *Store) changed() {
	s.mu.Lock()
	fns := append([]func(){}, s.onChange...)
	s.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// Resync reads the whole bucket again (after NATS came back).
func (s *Store) Resync() { s.mirror.Resync() }

// List returns the mappings, by network and port.
func (s *Store) List() []Mapping {
	all := s.mirror.All()
	sort.Slice(all, func(i, j int) bool {
		if all[i].Network != all[j].Network {
			return all[i].Network < all[j].Network
		}
		return all[i].Port < all[j].Port
	})
	return all
}

// Get returns the mapping of a port.
func (s *Store) Get(network string, port int) (Mapping, bool) {
	return s.mirror.Get(Key(network, port))
}

// Add maps a port. It fails with ErrMapped if the port is mapped already,
// whichever relay mapped it: NATS decides.
func (s *Store) Add(ctx context.Context, m Mapping) error {
	if err := m.Validate(); err != nil {
		return err
	}
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	rev, err := s.kv.Create(ctx, m.Key(), data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("%s port %d: %w", m.Network, m.Port, ErrMapped)
	}
	if err != nil {
		return fmt.Errorf("ports: map %s port %d: %w", m.Network, m.Port, err)
	}
	s.mirror.Put(m.Key(), m, rev)
	return nil
}

// Remove unmaps a port, or fails with ErrNotMapped.
func (s *Store) Remove(ctx context.Context, network string, port int) (Mapping, error) {
	key := Key(network, port)
	entry, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Mapping{}, fmt.Errorf("%s port %d: %w", network, port, ErrNotMapped)
	}
	if err != nil {
		return Mapping{}, fmt.Errorf("ports: unmap %s port %d: %w", network, port, err)
	}
	var m Mapping
	json.Unmarshal(entry.Value(), &m)
	if err := s.kv.Delete(ctx, key, jetstream.LastRevision(entry.Revision())); err != nil {
		return Mapping{}, fmt.Errorf("ports: unmap %s port %d: %w", network, port, err)
	}
	return m, nil
}
