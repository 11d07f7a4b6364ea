// Package authtest opens token stores for the tests of the packages that
// serve or use them.
package authtest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/store"
)

// Open opens a token store on an embedded NATS server in a temporary
// directory and writes an admin token to a file there, whose path it
// returns. All of it is closed when the test ends.
func Open(tb testing.TB) (tokens *auth.Store, adminTokenFile string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	dir := tb.TempDir()
	st, err := store.Open(ctx, store.Config{DataDir: dir})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	kv, err := st.KeyValue(ctx, auth.Bucket)
	if err != nil {
		tb.Fatal(err)
	}
	tokens, err = auth.Open(ctx, kv, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tokens.Close() })
	adminTokenFile = filepath.Join(dir, "admin.token")
	if _, err := tokens.EnsureAdminToken(ctx, adminTokenFile); err != nil {
		tb.Fatal(err)
	}
	return tokens, adminTokenFile
}
