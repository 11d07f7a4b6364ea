package auth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/store"
)

func TestAuthenticate(t *testing.T) {
	s := newTokens(t)
	agent, agentTok := mustCreate(t, s, CreateRequest{Kind: KindAgent, Name: "robot", Devices: []string{"robot-1"}})
	user, _ := mustCreate(t, s, CreateRequest{Kind: KindUser, Name: "alice"})
	admin, _ := mustCreate(t, s, CreateRequest{Kind: KindAdmin})
	revoked, revokedTok := mustCreate(t, s, CreateRequest{Kind: KindUser, Name: "bob"})
	if err := s.Revoke(testContext(t), revokedTok.ID); err != nil {
		t.Fatal(err)
	}
	secretOf := func(tok string) string { return tok[len(tok)-secretLen:] }
	otherSecret := strings.Repeat("A", secretLen)
	upperID := strings.ToUpper(agentTok.ID)
	if upperID == agentTok.ID { // all digits: the case alone must still be refused
		upperID = "A" + upperID[1:]
	}

	tests := []struct {
		name     string
		token    string
		wantErr  error
		wantKind Kind
	}{
		{"agent", agent, nil, KindAgent},
		{"user", user, nil, KindUser},
		{"admin", admin, nil, KindAdmin},
		{"empty", "", ErrNoToken, ""},
		{"revoked", revoked, ErrInvalidToken, ""},
		{"wrong secret", "sba_" + agentTok.ID + "_" + otherSecret, ErrInvalidToken, ""},
		{"unknown id", "sba_00000000_" + secretOf(agent), ErrInvalidToken, ""},
		{"kind letter swapped", "sbu_" + agentTok.ID + "_" + secretOf(agent), ErrInvalidToken, ""},
		{"admin letter on agent", "sbx_" + agentTok.ID + "_" + secretOf(agent), ErrInvalidToken, ""},
		{"unknown kind letter", "sbz_" + agentTok.ID + "_" + secretOf(agent), ErrInvalidToken, ""},
		{"bad prefix", "xba" + agent[3:], ErrInvalidToken, ""},
		{"uppercase id", "sba_" + upperID + "_" + secretOf(agent), ErrInvalidToken, ""},
		{"truncated", agent[:len(agent)-1], ErrInvalidToken, ""},
		{"extra byte", agent + "A", ErrInvalidToken, ""},
		{"leading space", " " + agent[1:], ErrInvalidToken, ""},
		{"padding in secret", agent[:len(agent)-1] + "=", ErrInvalidToken, ""},
		{"garbage", "Bearer hello", ErrInvalidToken, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := s.Authenticate(tt.token)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Authenticate = %v, want %v", err, tt.wantErr)
			}
			if p.Kind != tt.wantKind {
				t.Fatalf("kind = %q, want %q", p.Kind, tt.wantKind)
			}
		})
	}
}

func TestAuthenticateKind(t *testing.T) {
	s := newTokens(t)
	agent, tok := mustCreate(t, s, CreateRequest{Kind: KindAgent, Devices: []string{"d"}})
	p, err := s.AuthenticateKind(agent, KindAgent)
	if err != nil || p.TokenID != tok.ID {
		t.Fatalf("AuthenticateKind(agent, agent) = %+v, %v", p, err)
	}
	if _, err := s.AuthenticateKind(agent, KindAdmin); !errors.Is(err, ErrWrongKind) {
		t.Fatalf("AuthenticateKind(agent, admin) = %v, want ErrWrongKind", err)
	}
	if _, err := s.AuthenticateKind("nonsense", KindAdmin); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("AuthenticateKind(nonsense) = %v, want ErrInvalidToken", err)
	}
}

func TestPrincipalAllows(t *testing.T) {
	agent := Principal{Kind: KindAgent, Devices: []string{"robot-*", "lab-[0-9]", "gateway"}}
	user := Principal{Kind: KindUser, Devices: []string{"robot-1", "cam-?"}}
	everyDevice := Principal{Kind: KindUser}
	admin := Principal{Kind: KindAdmin}
	unscopedAgent := Principal{Kind: KindAgent}
	tests := []struct {
		p      Principal
		device string
		want   bool
	}{
		{agent, "robot-1", true},
		{agent, "robot-", true},
		{agent, "robot", false},
		{agent, "lab-7", true},
		{agent, "lab-77", false},
		{agent, "gateway", true},
		{agent, "gateway2", false},
		{agent, "", false},
		{user, "robot-1", true},
		{user, "robot-2", false},
		{user, "cam-a", true},
		{user, "cam-ab", false},
		{everyDevice, "anything", true},
		{admin, "anything", true},
		{unscopedAgent, "anything", false},
		{Principal{Kind: "bogus"}, "x", false},
	}
	for _, tt := range tests {
		if got := tt.p.Allows(tt.device); got != tt.want {
			t.Errorf("%s %v Allows(%q) = %v, want %v", tt.p.Kind, tt.p.Devices, tt.device, got, tt.want)
		}
	}
}

func TestCreateValidates(t *testing.T) {
	s := newTokens(t)
	tests := []struct {
		name string
		req  CreateRequest
		ok   bool
	}{
		{"agent", CreateRequest{Kind: KindAgent, Devices: []string{"robot-1"}}, true},
		{"agent glob", CreateRequest{Kind: KindAgent, Devices: []string{"robot-*", "lab-[0-9]", "x?"}}, true},
		{"agent no devices", CreateRequest{Kind: KindAgent, Name: "r"}, false},
		{"user all devices", CreateRequest{Kind: KindUser, Name: "alice"}, true},
		{"user without name", CreateRequest{Kind: KindUser}, false},
		{"admin", CreateRequest{Kind: KindAdmin}, true},
		{"admin with devices", CreateRequest{Kind: KindAdmin, Devices: []string{"a"}}, false},
		{"unknown kind", CreateRequest{Kind: "root", Name: "x", Devices: []string{"a"}}, false},
		{"empty kind", CreateRequest{Name: "x", Devices: []string{"a"}}, false},
		{"dot first", CreateRequest{Kind: KindAgent, Devices: []string{".hidden"}}, false},
		{"space", CreateRequest{Kind: KindAgent, Devices: []string{"a b"}}, false},
		{"slash", CreateRequest{Kind: KindAgent, Devices: []string{"a/b"}}, false},
		{"empty device", CreateRequest{Kind: KindAgent, Devices: []string{""}}, false},
		{"63 chars", CreateRequest{Kind: KindAgent, Devices: []string{strings.Repeat("a", 63)}}, true},
		{"64 chars", CreateRequest{Kind: KindAgent, Devices: []string{strings.Repeat("a", 64)}}, false},
		{"unicode", CreateRequest{Kind: KindAgent, Devices: []string{"roböt"}}, false},
		{"bad glob", CreateRequest{Kind: KindAgent, Devices: []string{"robot-["}}, false},
		{"backslash glob", CreateRequest{Kind: KindAgent, Devices: []string{`robot-\*`}}, false},
		{"dot glob", CreateRequest{Kind: KindAgent, Devices: []string{".*"}}, false},
		{"control char in name", CreateRequest{Kind: KindUser, Name: "al\x00ice"}, false},
		{"long name", CreateRequest{Kind: KindUser, Name: strings.Repeat("n", 129)}, false},
		{"too many devices", CreateRequest{Kind: KindAgent, Devices: manyDevices(257)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			secret, tok, err := s.Create(testContext(t), tt.req)
			if !tt.ok {
				if !errors.Is(err, ErrInvalidRequest) {
					t.Fatalf("Create = %v, want ErrInvalidRequest", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			if len(secret) != tokenLen || !strings.HasPrefix(secret, "sb"+string(tt.req.Kind.letter())+"_"+tok.ID+"_") {
				t.Fatalf("secret %q does not have the documented format", secret)
			}
		})
	}
}

func manyDevices(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("d%d", i)
	}
	return out
}

func TestCreateNormalizesDevicesAndName(t *testing.T) {
	s := newTokens(t)
	_, tok := mustCreate(t, s, CreateRequest{Kind: KindAgent, Name: "  arm  ", Devices: []string{" b", "a", "b"}})
	if tok.Name != "arm" || !slices.Equal(tok.Devices, []string{"b", "a"}) {
		t.Fatalf("token = %+v, want name arm and devices [b a]", tok)
	}
	_, _, err := s.Create(testContext(t), CreateRequest{Kind: KindAgent, Devices: []string{"a b"}})
	if !errors.Is(err, ErrInvalidDevice) || !strings.Contains(err.Error(), `"a b"`) {
		t.Fatalf("Create = %v, want an ErrInvalidDevice naming the device", err)
	}
}

func TestListAndRevoke(t *testing.T) {
	s := newTokens(t)
	ctx := testContext(t)
	_, first := mustCreate(t, s, CreateRequest{Kind: KindAgent, Name: "one", Devices: []string{"d1"}})
	secret, second := mustCreate(t, s, CreateRequest{Kind: KindUser, Name: "two"})

	if err := s.Revoke(ctx, second.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, second.ID); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	if _, err := s.Authenticate(secret); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("revoked token authenticates: %v", err)
	}
	for _, id := range []string{"00000000", "nothex!!", "", "../../x"} {
		if err := s.Revoke(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Revoke(%q) = %v, want ErrNotFound", id, err)
		}
	}

	list, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != first.ID || list[1].ID != second.ID {
		t.Fatalf("List = %+v, want [%s %s] oldest first", list, first.ID, second.ID)
	}
	if list[0].Revoked || !list[1].Revoked || list[1].RevokedAt.IsZero() {
		t.Fatalf("List revocation flags wrong: %+v", list)
	}
	list[0].Devices[0] = "mutated"
	if again, _ := s.List(ctx); again[0].Devices[0] != "d1" {
		t.Fatal("List returns the cache's own slices")
	}
}

func TestRevocationReachesOtherRelaysWithinASecond(t *testing.T) {
	hub := openNATS(t, store.Config{Listen: "127.0.0.1:0"})
	peer := openNATS(t, store.Config{URLs: []string{hub.ClientURL()}})
	a := openTokens(t, hub)
	b := openTokens(t, peer)

	var mu sync.Mutex // guards revokedOnB
	var revokedOnB []string
	b.OnRevoke(func(id string) {
		mu.Lock()
		defer mu.Unlock()
		revokedOnB = append(revokedOnB, id)
	})

	secret, tok := mustCreate(t, a, CreateRequest{Kind: KindAgent, Devices: []string{"robot-*"}})
	eventually(t, time.Second, func() error {
		_, err := b.Authenticate(secret)
		return err
	})
	if err := a.Revoke(testContext(t), tok.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, func() error {
		if _, err := b.Authenticate(secret); !errors.Is(err, ErrInvalidToken) {
			return fmt.Errorf("peer still accepts the revoked token: %v", err)
		}
		return nil
	})
	eventually(t, time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(revokedOnB, []string{tok.ID}) {
			return fmt.Errorf("OnRevoke saw %v, want [%s]", revokedOnB, tok.ID)
		}
		return nil
	})
}

func TestOnRevokeFiresForDeletedRecords(t *testing.T) {
	st := openNATS(t, store.Config{})
	s := openTokens(t, st)
	fired := make(chan string, 1)
	s.OnRevoke(func(id string) { fired <- id })
	secret, tok := mustCreate(t, s, CreateRequest{Kind: KindUser, Name: "u"})
	kv, err := st.KeyValue(testContext(t), Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(testContext(t), tok.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-fired:
		if id != tok.ID {
			t.Fatalf("OnRevoke(%q), want %q", id, tok.ID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnRevoke not called after the record was deleted")
	}
	if _, err := s.Authenticate(secret); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("deleted token authenticates: %v", err)
	}
}

func TestTokensLoadedOnOpenAndServedWithoutNATS(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(testContext(t), store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	first := openTokens(t, st)
	secret, _ := mustCreate(t, first, CreateRequest{Kind: KindAgent, Devices: []string{"robot-1"}})
	first.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st2, err := store.Open(testContext(t), store.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	s := openTokens(t, st2)
	if err := st2.Close(); err != nil { // NATS is gone: Authenticate must not need it
		t.Fatal(err)
	}
	p, err := s.Authenticate(secret)
	if err != nil || !p.Allows("robot-1") || p.Allows("robot-2") {
		t.Fatalf("Authenticate after reopen, without NATS = %+v, %v", p, err)
	}
}

func TestMalformedRecordIsIgnored(t *testing.T) {
	st := openNATS(t, store.Config{})
	kv, err := st.KeyValue(testContext(t), Bucket)
	if err != nil {
		t.Fatal(err)
	}
	for key, value := range map[string]string{
		"0000000a": "not json",
		"0000000b": `{"id":"0000000b","kind":"admin","secret_sha256":"abc"}`,
		"0000000c": `{"id":"ffffffff","kind":"admin","secret_sha256":"` + strings.Repeat("0", 64) + `"}`,
	} {
		if _, err := kv.Put(testContext(t), key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	s := openTokens(t, st)
	if list, _ := s.List(testContext(t)); len(list) != 0 {
		t.Fatalf("List = %+v, want malformed records skipped", list)
	}
	if err := s.Revoke(testContext(t), "0000000a"); err != nil {
		t.Fatalf("Revoke of a malformed record: %v", err)
	}
}

func TestEnsureAdminToken(t *testing.T) {
	ctx := testContext(t)
	path := filepath.Join(t.TempDir(), "data", "admin.token")
	s := newTokens(t)

	created, err := s.EnsureAdminToken(ctx, path)
	if err != nil || !created {
		t.Fatalf("first EnsureAdminToken = %v, %v; want created", created, err)
	}
	secret := readToken(t, path)
	assertMode(t, path, 0o600)
	assertMode(t, filepath.Dir(path), 0o700|os.ModeDir)
	if _, err := s.AuthenticateKind(secret, KindAdmin); err != nil {
		t.Fatalf("generated admin token does not authenticate: %v", err)
	}

	created, err = s.EnsureAdminToken(ctx, path)
	if err != nil || created || readToken(t, path) != secret {
		t.Fatalf("second EnsureAdminToken = %v, %v; want the file kept", created, err)
	}

	wiped := newTokens(t) // a fresh, empty token store
	created, err = wiped.EnsureAdminToken(ctx, path)
	if err != nil || created {
		t.Fatalf("EnsureAdminToken on a wiped store = %v, %v; want restored, not created", created, err)
	}
	if _, err := wiped.AuthenticateKind(secret, KindAdmin); err != nil {
		t.Fatalf("restored admin token does not authenticate: %v", err)
	}

	p, _ := s.Authenticate(secret)
	if err := s.Revoke(ctx, p.TokenID); err != nil {
		t.Fatal(err)
	}
	created, err = s.EnsureAdminToken(ctx, path)
	if err != nil || !created {
		t.Fatalf("EnsureAdminToken after revocation = %v, %v; want a new token", created, err)
	}
	if fresh := readToken(t, path); fresh == secret {
		t.Fatal("revoked admin token was kept in the file")
	} else if _, err := s.AuthenticateKind(fresh, KindAdmin); err != nil {
		t.Fatalf("replacement admin token does not authenticate: %v", err)
	}
}

func TestEnsureAdminTokenRejectsForeignFiles(t *testing.T) {
	s := newTokens(t)
	agent, _ := mustCreate(t, s, CreateRequest{Kind: KindAgent, Devices: []string{"d"}})
	forged := "sbx_" + agent[4:] // an admin-looking token over an agent's id
	for name, content := range map[string]string{
		"garbage":     "hello\n",
		"agent token": agent + "\n",
		"forged":      forged,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "admin.token")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := s.EnsureAdminToken(testContext(t), path); !errors.Is(err, ErrAdminTokenFile) {
				t.Fatalf("EnsureAdminToken = %v, want ErrAdminTokenFile", err)
			}
		})
	}
}

func readToken(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (os.ModePerm | os.ModeDir); got != want {
		t.Fatalf("%s has mode %v, want %v", path, got, want)
	}
}

func TestParseTokenRoundTrip(t *testing.T) {
	for _, kind := range []Kind{KindAgent, KindUser, KindAdmin} {
		pt, err := newToken(kind)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := parseToken(pt.String())
		if !ok || got != pt {
			t.Fatalf("parseToken(%q) = %+v, %v", pt.String(), got, ok)
		}
	}
}

func TestOpenGivesUpWithItsContext(t *testing.T) {
	st := openNATS(t, store.Config{})
	kv, err := st.KeyValue(testContext(t), Bucket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, kv, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Open with a cancelled context = %v, want context.Canceled", err)
	}
}
