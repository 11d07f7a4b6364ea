package store

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/switchboard-relay/switchboard/internal/testkit"
	"github.com/switchboard-relay/switchboard/internal/tlsconf/tlstest"
)

// writeFile writes content to a file of mode 0600 in a fresh directory and
// returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// nkeySeedFile writes a fresh nkey user seed to a file.
func nkeySeedFile(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "relay.nk", string(seed)+"\n")
}

// roundTrip writes a value through a and reads it back through b.
func roundTrip(t *testing.T, a, b *Store) {
	t.Helper()
	ctx := testContext(t)
	kvA, err := a.KeyValue(ctx, "auth_test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvA.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	kvB, err := b.KeyValue(ctx, "auth_test")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kvB.Get(ctx, "k"); err != nil || string(e.Value()) != "v" {
		t.Fatalf("peer reads %v, %v; want v", e, err)
	}
}

// expectAuthFailed opens a store on url with creds and expects NATS to
// refuse it, with an error that says so and does not show secret.
func expectAuthFailed(t *testing.T, url string, creds Credentials, secret string) {
	t.Helper()
	s, err := Open(testContext(t), Config{URLs: []string{url}, Credentials: creds})
	if err == nil {
		s.Close()
		t.Fatalf("Open with %v succeeded, want it refused", creds)
	}
	if !errors.Is(err, ErrAuthFailed) || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("Open with %v = %v, want ErrAuthFailed saying authentication failed", creds, err)
	}
	if secret != "" && strings.Contains(err.Error(), secret) {
		t.Fatalf("the error shows the secret: %v", err)
	}
}

func TestEmbeddedRequiresUserAndPassword(t *testing.T) {
	creds := Credentials{User: "relay", PasswordFile: writeFile(t, "password", "s3cret-pw\n")}
	logs := &testkit.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	hub := openStore(t, Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Credentials: creds, Logger: logger})

	peer := openStore(t, Config{URLs: []string{hub.ClientURL()}, Credentials: creds, Logger: logger})
	roundTrip(t, peer, hub)

	expectAuthFailed(t, hub.ClientURL(), Credentials{User: "relay", Password: "wrong-pw"}, "wrong-pw")
	expectAuthFailed(t, hub.ClientURL(), Credentials{User: "other", PasswordFile: creds.PasswordFile}, "s3cret-pw")
	expectAuthFailed(t, hub.ClientURL(), Credentials{}, "")

	for _, unwanted := range []string{"s3cret-pw", "wrong-pw", "Plaintext passwords"} {
		if logs.Count(unwanted) != 0 {
			t.Errorf("the logs show %q", unwanted)
		}
	}
}

func TestEmbeddedRequiresNkey(t *testing.T) {
	creds := Credentials{NkeySeedFile: nkeySeedFile(t)}
	hub := openStore(t, Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Credentials: creds})

	peer := openStore(t, Config{URLs: []string{hub.ClientURL()}, Credentials: creds})
	roundTrip(t, peer, hub)

	expectAuthFailed(t, hub.ClientURL(), Credentials{NkeySeedFile: nkeySeedFile(t)}, "")
	expectAuthFailed(t, hub.ClientURL(), Credentials{}, "")
}

func TestEmbeddedRequiresToken(t *testing.T) {
	creds := Credentials{TokenFile: writeFile(t, "token", "tok-0123456789\n")}
	hub := openStore(t, Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Credentials: creds})

	peer := openStore(t, Config{URLs: []string{hub.ClientURL()}, Credentials: creds})
	roundTrip(t, peer, hub)

	expectAuthFailed(t, hub.ClientURL(), Credentials{Token: "tok-wrong"}, "tok-wrong")
	expectAuthFailed(t, hub.ClientURL(), Credentials{}, "")
}

// TestInProcessConnectionPresentsCredentials: with credentials but no
// listener, the embedded server still demands them, and the store's own
// in-process connection presents them. (A raw in-process connection without
// credentials is not tried: nats.go waits out its timeout on the closed pipe.)
func TestInProcessConnectionPresentsCredentials(t *testing.T) {
	s := openStore(t, Config{DataDir: t.TempDir(), Credentials: Credentials{User: "relay", Password: "pw"}})
	if _, err := s.KeyValue(testContext(t), "in_process"); err != nil {
		t.Fatal(err)
	}
	v, err := s.ns.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !v.AuthRequired {
		t.Fatal("the embedded server does not demand credentials")
	}
}

func TestListenWithoutHostBindsLoopbackOnly(t *testing.T) {
	for _, listen := range []string{":0", "localhost:0"} {
		t.Run(listen, func(t *testing.T) {
			s := openStore(t, Config{DataDir: t.TempDir(), Listen: listen})
			addr, ok := s.ns.Addr().(*net.TCPAddr)
			if !ok || !addr.IP.IsLoopback() {
				t.Fatalf("the server listens on %v, want a loopback address", s.ns.Addr())
			}
			if !strings.HasPrefix(s.ClientURL(), "nats://127.0.0.1:") {
				t.Fatalf("ClientURL = %q, want nats://127.0.0.1:<port>", s.ClientURL())
			}
		})
	}
}

func TestListenBeyondLoopbackRequiresCredentials(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:4333", "[::]:4333", "10.0.0.5:4333", "relay-1.internal:4333"} {
		t.Run(listen, func(t *testing.T) {
			_, err := Open(testContext(t), Config{DataDir: t.TempDir(), Listen: listen})
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Open = %v, want ErrInvalidConfig", err)
			}
			for _, want := range []string{"without credentials", "Credentials.PasswordFile", "loopback", ":4333"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the message %q does not mention %q", err, want)
				}
			}
		})
	}

	t.Run("with credentials", func(t *testing.T) {
		creds := Credentials{User: "relay", Password: "pw"}
		s := openStore(t, Config{DataDir: t.TempDir(), Listen: "0.0.0.0:0", Credentials: creds})
		if addr := s.ns.Addr().(*net.TCPAddr); !addr.IP.IsUnspecified() {
			t.Fatalf("the server listens on %v, want every interface", addr)
		}
		peer := openStore(t, Config{URLs: []string{s.ClientURL()}, Credentials: creds})
		roundTrip(t, peer, s)
	})
}

func TestCAFileVerifiesTLSServer(t *testing.T) {
	ca := tlstest.NewCA(t)
	cert, err := tls.X509KeyPair(ca.Issue(t, "switchboard test NATS"))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
	})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(readyTimeout) {
		t.Fatal("TLS NATS server not ready")
	}
	url := fmt.Sprintf("tls://127.0.0.1:%d", ns.Addr().(*net.TCPAddr).Port)

	if _, err := Open(testContext(t), Config{URLs: []string{url}}); err == nil {
		t.Fatal("Open trusted a certificate no known CA signed")
	}
	s := openStore(t, Config{URLs: []string{url}, CAFile: writeFile(t, "ca.pem", string(ca.PEM()))})
	if _, err := s.KeyValue(testContext(t), "over_tls"); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidateCredentials(t *testing.T) {
	ext := []string{"tls://nats-1:4222"}
	tests := []struct {
		name string
		cfg  Config
		want string // in the message; "" = valid
	}{
		{"user and password file", Config{Credentials: Credentials{User: "relay", PasswordFile: "/pw"}}, ""},
		{"token file, listening beyond loopback", Config{Listen: "0.0.0.0:4333", Credentials: Credentials{TokenFile: "/tok"}}, ""},
		{"nkey, external", Config{URLs: ext, Credentials: Credentials{NkeySeedFile: "/nk"}}, ""},
		{"creds, external", Config{URLs: ext, Credentials: Credentials{CredsFile: "/relay.creds"}}, ""},
		{"CA file, external", Config{URLs: ext, CAFile: "/ca.pem"}, ""},
		{"loopback needs nothing", Config{Listen: "127.0.0.1:4333"}, ""},
		{"IPv6 loopback needs nothing", Config{Listen: "[::1]:4333"}, ""},
		{"two kinds", Config{Credentials: Credentials{User: "relay", PasswordFile: "/pw", TokenFile: "/tok"}}, "several kinds"},
		{"user without password", Config{Credentials: Credentials{User: "relay"}}, "has no password"},
		{"password without user", Config{Credentials: Credentials{PasswordFile: "/pw"}}, "add Credentials.User"},
		{"password twice", Config{Credentials: Credentials{User: "relay", Password: "pw", PasswordFile: "/pw"}}, "give one"},
		{"token twice", Config{Credentials: Credentials{Token: "t", TokenFile: "/tok"}}, "give one"},
		{"creds, embedded", Config{Credentials: Credentials{CredsFile: "/relay.creds"}}, "operator mode"},
		{"CA file, embedded", Config{CAFile: "/ca.pem"}, "does not use TLS"},
		{"credentials in URL too", Config{URLs: []string{"nats://relay:pw@nats-1:4222"}, Credentials: Credentials{TokenFile: "/tok"}}, "give them once"},
		{"open listener", Config{Listen: "0.0.0.0:4333"}, "without credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Complete()
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tt.want != "" && (!errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate = %v, want ErrInvalidConfig saying %q", err, tt.want)
			}
		})
	}
}

func TestCredentialFilesAreChecked(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent")
	accountSeed := func() string {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		return writeFile(t, "account.nk", string(seed))
	}
	tests := []struct {
		name  string
		creds Credentials
		want  string
	}{
		{"missing password file", Credentials{User: "relay", PasswordFile: missing}, "reading the NATS password"},
		{"empty password file", Credentials{User: "relay", PasswordFile: writeFile(t, "pw", "\n")}, "is empty"},
		{"missing token file", Credentials{TokenFile: missing}, "reading the NATS token"},
		{"not a seed", Credentials{NkeySeedFile: writeFile(t, "nk", "hello")}, "nk -gen user"},
		{"account seed", Credentials{NkeySeedFile: accountSeed()}, "no user seed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(testContext(t), Config{DataDir: t.TempDir(), Credentials: tt.creds})
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open = %v, want ErrInvalidConfig saying %q", err, tt.want)
			}
		})
	}
}

func TestPasswordFileKeepsInnerWhiteSpace(t *testing.T) {
	sec, err := Credentials{User: "relay", PasswordFile: writeFile(t, "pw", " a b \r\n")}.load()
	if err != nil {
		t.Fatal(err)
	}
	if sec.password != " a b " {
		t.Fatalf("password = %q, want %q (one trailing newline dropped)", sec.password, " a b ")
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	cfg := Config{Credentials: Credentials{User: "relay", Password: "pw-secret", Token: "tok-secret"}}
	urls := []string{"nats://relay:url-secret@nats-1:4222", "nats://url-token@nats-2:4222"}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "credentials", cfg.Credentials)
	shown := []string{
		fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprint(cfg.Credentials), logged.String(),
		displayURL(strings.Join(urls, ",")),
	}
	for _, s := range shown {
		for _, secret := range []string{"pw-secret", "tok-secret", "url-secret", "url-token"} {
			if strings.Contains(s, secret) {
				t.Errorf("%q shows %s", s, secret)
			}
		}
	}
	if got := displayURL(urls[0]); got != "nats://relay:xxxxx@nats-1:4222" {
		t.Errorf("displayURL = %q, want the user kept and the password hidden", got)
	}
}

// TestReconnectOutlastsRefusedCredentials: while the server refuses the
// relay's credentials (a rotation done in the wrong order), the store says
// so once and keeps trying, and reconnects once they are accepted again.
func TestReconnectOutlastsRefusedCredentials(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()
	creds := Credentials{User: "relay", Password: "old-pw"}
	hub, err := Open(ctx, Config{DataDir: dir, Listen: "127.0.0.1:0", Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	url := hub.ClientURL()
	listen := strings.TrimPrefix(url, "nats://")
	logs := &testkit.Buffer{}
	openStore(t, Config{URLs: []string{url}, Credentials: creds, Logger: slog.New(slog.NewTextHandler(logs, nil))})

	if err := hub.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, logged(logs, "lost connection to NATS", 1))
	serverLogs := &testkit.Buffer{}
	rotated, err := Open(ctx, Config{DataDir: dir, Listen: listen, Credentials: Credentials{User: "relay", Password: "new-pw"},
		Logger: slog.New(slog.NewTextHandler(serverLogs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, logged(logs, "NATS refuses this relay's credentials", 1))
	// nats.go gives up on a server that refused it twice, unless told not to.
	eventually(t, 15*time.Second, func() error {
		if n := serverLogs.Count("authentication error"); n < 3 {
			return fmt.Errorf("the server refused %d attempts, want 3", n)
		}
		return nil
	})
	if err := rotated.Close(); err != nil {
		t.Fatal(err)
	}

	openStore(t, Config{DataDir: dir, Listen: listen, Credentials: creds})
	eventually(t, 10*time.Second, logged(logs, "reconnected to NATS", 1))
	if n := logs.Count("NATS refuses this relay's credentials"); n != 1 {
		t.Errorf("the refusal was logged %d times, want once", n)
	}
	if n := logs.Count("old-pw"); n != 0 {
		t.Errorf("the logs show the password")
	}
}
