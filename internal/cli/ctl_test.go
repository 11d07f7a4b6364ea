package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/auth/authtest"
	"github.com/switchboard-relay/switchboard/internal/control"
)

// ctlFixture is a real admin listener (control handler, token store,
// embedded NATS) for ctl to talk to.
type ctlFixture struct {
	url       string
	tokenFile string
	tokens    *auth.Store
}

func newCtlFixture(t *testing.T) *ctlFixture {
	t.Helper()
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // runs after every other cleanup
	tokens, tokenFile := authtest.Open(t)
	srv := httptest.NewServer(control.NewHandler(control.Config{Tokens: tokens}))
	t.Cleanup(srv.Close)
	return &ctlFixture{url: srv.URL, tokenFile: tokenFile, tokens: tokens}
}

// ctl runs 'switchboard ctl --admin … --token-file … args…'.
func (f *ctlFixture) ctl(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	full := append([]string{"--admin", f.url, "--token-file", f.tokenFile}, args...)
	err = runCtl(context.Background(), full, &out, &errOut)
	return out.String(), errOut.String(), err
}

func (f *ctlFixture) mustCtl(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, err := f.ctl(t, args...)
	if err != nil {
		t.Fatalf("ctl %v: %v\nstderr: %s", args, err, stderr)
	}
	return stdout, stderr
}

func TestCtlTokensCreateAgentPrintsSecretAlone(t *testing.T) {
	f := newCtlFixture(t)
	stdout, stderr := f.mustCtl(t, "tokens", "create", "--device", "robot-1,lab-*", "--device", "gw", "--name", "arm")
	secret := strings.TrimSuffix(stdout, "\n")
	if strings.Contains(secret, "\n") || secret == "" {
		t.Fatalf("stdout = %q, want the secret alone on one line", stdout)
	}
	p, err := f.tokens.AuthenticateKind(secret, auth.KindAgent)
	if err != nil {
		t.Fatalf("printed secret does not authenticate: %v", err)
	}
	if !slices.Equal(p.Devices, []string{"robot-1", "lab-*", "gw"}) || p.Name != "arm" {
		t.Fatalf("principal = %+v", p)
	}
	if !strings.Contains(stderr, p.TokenID) || !strings.Contains(stderr, "once") {
		t.Fatalf("stderr = %q, want the id and a once-only hint", stderr)
	}
}

func TestCtlTokensCreateUserJSON(t *testing.T) {
	f := newCtlFixture(t)
	stdout, _ := f.mustCtl(t, "-o", "json", "tokens", "create", "--user", "alice")
	if !strings.HasPrefix(stdout, "{\n  \"id\": \"") || !strings.Contains(stdout, "\n  \"token\": \"sbu_") {
		t.Fatalf("stdout = %q, want {\"id\": ..., \"token\": ...}", stdout)
	}
	var ct control.CreatedToken
	if err := json.Unmarshal([]byte(stdout), &ct); err != nil {
		t.Fatal(err)
	}
	p, err := f.tokens.Authenticate(ct.Token)
	if err != nil || p.Kind != auth.KindUser || p.Name != "alice" || !p.Allows("anything") {
		t.Fatalf("user token: %+v, %v", p, err)
	}
}

func TestCtlTokensListAndRevoke(t *testing.T) {
	f := newCtlFixture(t)
	secret, _ := f.mustCtl(t, "tokens", "create", "--device", "robot-1")
	p, err := f.tokens.Authenticate(strings.TrimSpace(secret))
	if err != nil {
		t.Fatal(err)
	}

	table, _ := f.mustCtl(t, "tokens", "list")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(table, p.TokenID) {
		t.Fatalf("table =\n%s\nwant a header, the admin token and %s", table, p.TokenID)
	}
	if col := strings.Index(lines[0], "KIND"); lines[1][col-1] != ' ' || lines[2][col-1] != ' ' {
		t.Fatalf("columns not aligned:\n%s", table)
	}
	if strings.Contains(table, strings.TrimSpace(secret)) {
		t.Fatal("list shows a secret")
	}

	out, _ := f.mustCtl(t, "tokens", "revoke", p.TokenID)
	if !strings.Contains(out, p.TokenID) {
		t.Fatalf("revoke printed %q", out)
	}
	if _, err := f.tokens.Authenticate(strings.TrimSpace(secret)); !errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("revoked token authenticates: %v", err)
	}

	// Global flags may also follow the command.
	js, _ := f.mustCtl(t, "tokens", "list", "-o", "json")
	var list []control.Token
	if err := json.Unmarshal([]byte(js), &list); err != nil || len(list) != 2 {
		t.Fatalf("list -o json = %s (%v)", js, err)
	}
	if list[1].ID != p.TokenID || !list[1].Revoked {
		t.Fatalf("list -o json = %+v, want %s revoked", list, p.TokenID)
	}
	out, _ = f.mustCtl(t, "tokens", "revoke", p.TokenID, "-o", "json")
	if !strings.Contains(out, `"revoked": true`) {
		t.Fatalf("revoke -o json = %q", out)
	}
}

func TestCtlUsageErrors(t *testing.T) {
	f := newCtlFixture(t)
	tests := []struct {
		name string
		args []string
		want string // in the error message
	}{
		{"no command", nil, "tokens"},
		{"unknown command", []string{"frobnicate"}, "tokens"},
		{"roll without an update step", []string{"roll"}, "--update-cmd"},
		{"tokens without command", []string{"tokens"}, "create, list or revoke"},
		{"tokens unknown", []string{"tokens", "rotate"}, "create, list or revoke"},
		{"create without scope", []string{"tokens", "create"}, "--device"},
		{"create user and name", []string{"tokens", "create", "--user", "a", "--name", "b"}, "--user"},
		{"create stray argument", []string{"tokens", "create", "--device", "a", "extra"}, "extra"},
		{"bad output", []string{"-o", "yaml", "tokens", "list"}, "table or json"},
		{"unknown flag", []string{"tokens", "list", "--bogus"}, "bogus"},
		{"revoke without id", []string{"tokens", "revoke"}, "token ID"},
		{"revoke two ids", []string{"tokens", "revoke", "a", "b"}, "token ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := f.ctl(t, tt.args...)
			if !errors.As(err, new(*UsageError)) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ctl %v = %v, want a usage error mentioning %q", tt.args, err, tt.want)
			}
		})
	}
}

func TestCtlFailures(t *testing.T) {
	f := newCtlFixture(t)
	agentSecret, _ := f.mustCtl(t, "tokens", "create", "--device", "d")
	agentFile := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(agentFile, []byte(agentSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	var apiErr *control.APIError

	_, _, err := f.ctl(t, "tokens", "revoke", "0badc0de")
	if !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Fatalf("revoke unknown = %v, want *APIError 404", err)
	}
	_, _, err = f.ctl(t, "tokens", "create", "--device", "a b")
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(err.Error(), `"a b"`) {
		t.Fatalf("create bad device = %v, want *APIError 400 naming the device", err)
	}
	_, _, err = f.ctl(t, "--token-file", agentFile, "tokens", "list")
	if !errors.As(err, &apiErr) || apiErr.Status != 403 || !strings.Contains(err.Error(), agentFile) {
		t.Fatalf("agent token = %v, want *APIError 403 naming the token file", err)
	}
	missing := filepath.Join(t.TempDir(), "nope.token")
	_, _, err = f.ctl(t, "--token-file", missing, "tokens", "list")
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "--token-file") {
		t.Fatalf("missing token file = %v, want a hint about --token-file", err)
	}
	_, _, err = f.ctl(t, "--admin", "http://127.0.0.1:1", "tokens", "list")
	if !errors.Is(err, control.ErrUnreachable) || !strings.Contains(err.Error(), "--admin") {
		t.Fatalf("unreachable = %v, want ErrUnreachable with a hint about --admin", err)
	}
}

func TestCtlExitCodes(t *testing.T) {
	f := newCtlFixture(t)
	run := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		full := append([]string{"ctl", "--admin", f.url, "--token-file", f.tokenFile}, args...)
		code := Run(context.Background(), full, &out, &errOut)
		return code, errOut.String()
	}
	if code, stderr := run("tokens", "list"); code != ExitOK {
		t.Fatalf("list: exit %d, stderr %s", code, stderr)
	}
	if code, stderr := run("roll"); code != ExitUsage || !strings.Contains(stderr, "--update-cmd") {
		t.Fatalf("roll: exit %d, stderr %q; want %d naming --update-cmd", code, stderr, ExitUsage)
	}
	if code, stderr := run("tokens", "revoke", "0badc0de"); code != ExitFailure || !strings.Contains(stderr, "404") {
		t.Fatalf("revoke unknown: exit %d, stderr %q; want %d with the status", code, stderr, ExitFailure)
	}
	if code, _ := run("-h"); code != ExitOK {
		t.Fatalf("ctl -h: exit %d, want %d", code, ExitOK)
	}
}
