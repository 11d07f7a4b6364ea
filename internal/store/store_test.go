package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openStore(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(testContext(t), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// eventually polls check until it returns nil or the deadline passes.
var eventually = testkit.Eventually

func TestEmbeddedDataPersistsAcrossReopen(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()

	s, err := Open(ctx, Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if s.ClientURL() != "" {
		t.Errorf("ClientURL = %q, want empty for an in-process server", s.ClientURL())
	}
	kv, err := s.KeyValue(ctx, "persist_test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nats", "jetstream")); err != nil {
		t.Fatalf("JetStream files not under <DataDir>/nats: %v", err)
	}

	s2 := openStore(t, Config{DataDir: dir, ServerName: "renamed"}) // a new host name keeps the data
	kv2, err := s2.KeyValue(ctx, "persist_test")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv2.Get(ctx, "k")
	if err != nil {
		t.Fatalf("Get after reopen: %v", err)
	}
	if string(e.Value()) != "v1" {
		t.Fatalf("value after reopen = %q, want v1", e.Value())
	}
}

func TestExternalModeSharesStateWithListeningServer(t *testing.T) {
	ctx := testContext(t)
	hub := openStore(t, Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if !strings.HasPrefix(hub.ClientURL(), "nats://127.0.0.1:") {
		t.Fatalf("ClientURL = %q, want nats://127.0.0.1:<port>", hub.ClientURL())
	}
	peer := openStore(t, Config{URLs: []string{hub.ClientURL()}})

	kvPeer, err := peer.KeyValue(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvPeer.Put(ctx, "relay", []byte("rl-1")); err != nil {
		t.Fatal(err)
	}
	kvHub, err := hub.KeyValue(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kvHub.Get(ctx, "relay")
	if err != nil || string(e.Value()) != "rl-1" {
		t.Fatalf("hub sees %v, %v; want rl-1", e, err)
	}
	if peer.Conn() == nil || peer.JetStream() == nil {
		t.Fatal("Conn or JetStream is nil")
	}
}

func TestExternalConnectionLogsDisconnectAndReconnectOnce(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()
	hub, err := Open(ctx, Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	url := hub.ClientURL()
	logs := &testkit.Buffer{}
	openStore(t, Config{URLs: []string{url}, Logger: slog.New(slog.NewTextHandler(logs, nil))})

	if err := hub.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, logged(logs, "lost connection to NATS", 1))

	listen := strings.TrimPrefix(url, "nats://")
	openStore(t, Config{DataDir: dir, Listen: listen})
	eventually(t, 10*time.Second, logged(logs, "reconnected to NATS", 1))
	if n := logs.Count("lost connection to NATS"); n != 1 {
		t.Errorf("disconnect logged %d times, want once", n)
	}
}

func TestCloseIsIdempotentAndStopsBuckets(t *testing.T) {
	s, err := Open(testContext(t), Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.KeyValue(testContext(t), "late"); !errors.Is(err, ErrClosed) {
		t.Fatalf("KeyValue after Close = %v, want ErrClosed", err)
	}
}

func TestOpenFailsWhenDataDirIsAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(testContext(t), Config{DataDir: file})
	if !errors.Is(err, ErrEmbeddedStart) {
		t.Fatalf("Open = %v, want ErrEmbeddedStart", err)
	}
}

func TestOpenFailsWhenExternalServerIsAbsent(t *testing.T) {
	_, err := Open(testContext(t), Config{URLs: []string{"nats://127.0.0.1:1"}})
	if err == nil || errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Open = %v, want a connection error", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero value", Config{}, true},
		{"listen", Config{Listen: "127.0.0.1:4333"}, true},
		{"listen port only, loopback", Config{Listen: ":4333"}, true},
		{"external", Config{URLs: []string{"nats://a:4222", " b:4222 ", ""}, Replicas: 3}, true},
		{"tls", Config{URLs: []string{"tls://a:4222"}}, true},
		{"listen with external", Config{URLs: []string{"nats://a:4222"}, Listen: ":4333"}, false},
		{"listen without port", Config{Listen: "localhost"}, false},
		{"listen bad port", Config{Listen: "localhost:http"}, false},
		{"listen port too big", Config{Listen: ":70000"}, false},
		{"bad scheme", Config{URLs: []string{"http://a:4222"}}, false},
		{"no host", Config{URLs: []string{"nats://"}}, false},
		{"replicas embedded", Config{Replicas: 3}, false},
		{"replicas too many", Config{URLs: []string{"nats://a"}, Replicas: 7}, false},
		{"server name with space", Config{ServerName: "my relay"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Complete()
			err := cfg.Validate()
			if tt.ok && err != nil {
				t.Fatalf("Validate = %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestCompleteFillsDefaults(t *testing.T) {
	var cfg Config
	cfg.Complete()
	if cfg.DataDir != DefaultDataDir || cfg.Replicas != 1 || cfg.Logger == nil || cfg.ServerName == "" {
		t.Fatalf("Complete left %+v", cfg)
	}
}

// logged is a check for eventually: msg is in b exactly n times.
func logged(b *testkit.Buffer, msg string, n int) func() error {
	return func() error {
		if got := b.Count(msg); got != n {
			return fmt.Errorf("%q logged %d times, want %d", msg, got, n)
		}
		return nil
	}
}
