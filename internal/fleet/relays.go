package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// RelayIDFile is the name of the file in the data directory that keeps the
// relay's id across restarts.
const RelayIDFile = "relay.id"

var relayIDPattern = regexp.MustCompile(`^rl-[0-9a-f]{8}$`)

// ValidRelayID reports whether id has the form rl-<8 hex>.
func ValidRelayID(id string) bool { return relayIDPattern.MatchString(id) }

// RelayIDFromName returns the relay id of a relay named name: the same id
// for the same name, every time and on every machine, so that a relay with
// a stable name (a StatefulSet pod) keeps its id without keeping a file.
func RelayIDFromName(name string) string {
	sum := sha256.Sum256([]byte("switchboard relay id\x00" + name))
	return "rl-" + hex.EncodeToString(sum[:4])
}

// LoadOrCreateRelayID returns the relay id kept in dataDir, minting one
// (rl-<8 hex>) and writing it on first start.
func LoadOrCreateRelayID(dataDir string) (id string, created bool, err error) {
	path := filepath.Join(dataDir, RelayIDFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		id = strings.TrimSpace(string(data))
		if !ValidRelayID(id) {
			return "", false, fmt.Errorf("%s holds %q, not a relay id (rl-<8 hex>); remove the file to enrol as a new relay", path, id)
		}
		return id, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", false, fmt.Errorf("reading the relay id: %w", err)
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", false, err
	}
	id = "rl-" + hex.EncodeToString(b[:])
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", false, fmt.Errorf("creating the data directory: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return "", false, fmt.Errorf("writing the relay id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", false, fmt.Errorf("writing the relay id: %w", err)
	}
	return id, true, nil
}

// Report is what a relay says about itself on each heartbeat.
type Report struct {
	Hostname        string
	Region          string
	Addresses       []string
	Version         string
	Healthy         bool
	Draining        bool // the relay volunteers to drain; sticky like an operator's drain
	Stopping        bool // the relay is shutting down; not sticky
	ForwardSessions int
	MaxForward      int
	AgentSessions   int
	StartedAt       time.Time // when the relay process started
	// The fleet secret the relay runs: see Relay.
	SecretFingerprint string
	SecretAccepted    []string
	SecretSource      string
}

// BeatAnswer is what a heartbeat learns back.
type BeatAnswer struct {
	// ShouldDrain is the stored drain flag after the beat: true when an
	// operator (or the relay itself, earlier) asked it to drain.
	ShouldDrain bool
	// Enrolled is true when this beat created the relay's record.
	Enrolled bool
}

// beat writes relay id's heartbeat. The stored drain flag becomes stored OR
// reported: a relay can volunteer to drain, but a beat never clears a drain.
func beat(ctx context.Context, kv jetstream.KeyValue, id string, r Report, interval time.Duration) (BeatAnswer, error) {
	var enrolled bool
	rec, err := update(ctx, kv, id, func(cur Relay, found bool) (Relay, bool, error) {
		t := now()
		enrolled = !found
		next := Relay{
			ID: id, Hostname: r.Hostname, Region: r.Region, Addresses: nonNil(r.Addresses),
			Version: r.Version, Healthy: r.Healthy,
			Draining: cur.Draining || r.Draining, Stopping: r.Stopping,
			EnrolledAt: cur.EnrolledAt, StartedAt: r.StartedAt, LastSeenAt: t,
			ForwardSessions: r.ForwardSessions, MaxForward: r.MaxForward,
			AgentSessions: r.AgentSessions, BeatIntervalMS: interval.Milliseconds(),
			SecretFingerprint: r.SecretFingerprint, SecretAccepted: r.SecretAccepted, SecretSource: r.SecretSource,
		}
		if !found {
			next.EnrolledAt = t
		}
		return next, true, nil
	})
	if err != nil {
		return BeatAnswer{}, err
	}
	return BeatAnswer{ShouldDrain: rec.Draining, Enrolled: enrolled}, nil
}

// setDraining writes relay id's drain flag directly: the only way to clear
// it. It reports whether the flag changed.
func setDraining(ctx context.Context, kv jetstream.KeyValue, id string, draining bool) (changed bool, err error) {
	_, err = update(ctx, kv, id, func(cur Relay, found bool) (Relay, bool, error) {
		if !found {
			return cur, false, fmt.Errorf("relay %q: %w", id, ErrNotFound)
		}
		changed = cur.Draining != draining
		cur.Draining = draining
		// Written even when unchanged: a read may come from a replica
		// that lags (a NATS cluster without its quorum serves direct
		// reads, no writes), and only a write NATS confirms tells the
		// operator the flag is what they asked for.
		return cur, true, nil
	})
	return changed, err
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
