package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/secret"
)

func TestCtlCodesCreate(t *testing.T) {
	dir := t.TempDir()
	n, err := node.Start(context.Background(), node.Config{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	userTok, _, err := n.Tokens().Create(context.Background(), auth.CreateRequest{Kind: auth.KindUser, Name: "ann", Devices: []string{"robot-*"}})
	if err != nil {
		t.Fatal(err)
	}
	userFile := filepath.Join(dir, "user.token")
	if err := os.WriteFile(userFile, []byte(userTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl := func(args ...string) (string, string, error) {
		var out, errOut bytes.Buffer
		err := runCtl(context.Background(), append([]string{"--admin", "http://" + n.AdminAddr(), "--token-file", userFile}, args...), &out, &errOut)
		return out.String(), errOut.String(), err
	}

	out, stderr, err := ctl("codes", "create", "robot-1", "--path", "/ui/", "--ttl", "20s")
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	code := strings.TrimSpace(out)
	g, err := access.Decode(n.Secrets().VerifyKeys(secret.PurposeCode), access.CodePrefix, code, time.Now())
	if err != nil || g.Device != "robot-1" || g.Scope != "/ui/" || g.Expires.Sub(g.Issued) > 21*time.Second {
		t.Fatalf("code %q: %+v, %v", code, g, err)
	}

	out, stderr, err = ctl("-o", "json", "codes", "create", "robot-2", "--url", "https://relay.example.com/")
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	var got struct {
		Code, Device, Path, URLPath, URL string
		ExpiresAt                        time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Device != "robot-2" || got.Path != "/" || got.URL != "https://relay.example.com/client/robot-2/?code="+got.Code || got.ExpiresAt.IsZero() {
		t.Errorf("json %s", out)
	}

	for _, c := range []struct {
		args  []string
		words string
	}{
		{[]string{"codes", "create", "lab-1"}, `may not use device "lab-1"`},
		{[]string{"codes", "create", "robot-1", "--ttl", "90s"}, "1s to 60s"},
		{[]string{"codes", "create"}, "exactly one device"},
		{[]string{"codes", "create", "robot-1", "--path", "ui"}, "must start with '/'"},
		{[]string{"codes", "create", "bad name"}, "letters, digits"},
		{[]string{"codes"}, "codes create DEVICE"},
	} {
		if _, stderr, err := ctl(c.args...); err == nil || !strings.Contains(err.Error()+stderr, c.words) {
			t.Errorf("ctl %v: %v %s, want %q", c.args, err, stderr, c.words)
		}
	}
}
