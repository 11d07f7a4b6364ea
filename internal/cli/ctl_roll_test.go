package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/control"
)

// TestRollAsksTheServersGuards: the roll's guard is the server's check
// alone. A relay that does not answer the check (405 here) gets no roll,
// even where the same guard applied to its list of relays would pass: the
// roll refuses before it holds or records anything.
func TestRollAsksTheServersGuards(t *testing.T) {
	var writes atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+control.PathRoll, func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(control.RollInfo{Enabled: true})
	})
	mux.HandleFunc("GET "+control.PathRelays, func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode([]control.Relay{
			{ID: "rl-0000000a", Fresh: true, Healthy: true, AttachedDevices: 2, MaxForward: 512},
			{ID: "rl-0000000b", Fresh: true, Healthy: true, MaxForward: 512},
		})
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, _ *http.Request) { writes.Add(1) })
	mux.HandleFunc("PUT /", func(w http.ResponseWriter, _ *http.Request) { writes.Add(1) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	tokenFile := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(tokenFile, []byte("sbx_00000000_"+strings.Repeat("A", 43)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCode(t.Context(), "--admin", srv.URL, "--token-file", tokenFile, "roll", "--update-cmd", "true")
	if code != ExitFailure || !strings.Contains(stderr, "405 Method Not Allowed") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if n := writes.Load(); n != 0 {
		t.Fatalf("the refused roll wrote %d times to the API", n)
	}
}
