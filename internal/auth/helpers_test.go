package auth

import (
	"context"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testContext(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// openNATS starts a store on an embedded NATS server in a fresh directory.
func openNATS(tb testing.TB, cfg store.Config) *store.Store {
	tb.Helper()
	if cfg.DataDir == "" && len(cfg.URLs) == 0 {
		cfg.DataDir = tb.TempDir()
	}
	st, err := store.Open(testContext(tb), cfg)
	if err != nil {
		tb.Fatalf("store.Open: %v", err)
	}
	tb.Cleanup(func() {
		if err := st.Close(); err != nil {
			tb.Errorf("store.Close: %v", err)
		}
	})
	return st
}

// openTokens opens a token store on st's token bucket.
func openTokens(tb testing.TB, st *store.Store) *Store {
	tb.Helper()
	ctx := testContext(tb)
	kv, err := st.KeyValue(ctx, Bucket)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := Open(ctx, kv, nil)
	if err != nil {
		tb.Fatalf("auth.Open: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// newTokens returns a token store on a fresh embedded NATS server.
func newTokens(tb testing.TB) *Store {
	tb.Helper()
	return openTokens(tb, openNATS(tb, store.Config{}))
}

func mustCreate(tb testing.TB, s *Store, req CreateRequest) (string, Token) {
	tb.Helper()
	secret, tok, err := s.Create(testContext(tb), req)
	if err != nil {
		tb.Fatalf("Create(%+v): %v", req, err)
	}
	return secret, tok
}

// eventually polls check until it returns nil or the deadline passes.
var eventually = testkit.Eventually
