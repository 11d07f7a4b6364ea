package cli

import (
	"context"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/store"
)

func TestServeFlagsNATSCredentials(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg node.Config
	var logf logFlags
	serveFlags(fs, &cfg, &logf)
	err := fs.Parse([]string{
		"--nats", "tls://n1:4222",
		"--nats-user", "relay", "--nats-password-file", "/run/secrets/nats-password",
		"--nats-token-file", "/run/secrets/nats-token",
		"--nats-nkey-file", "/run/secrets/relay.nk",
		"--nats-creds", "/run/secrets/relay.creds",
		"--nats-ca-file", "/etc/switchboard/nats-ca.pem",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := store.Credentials{
		User: "relay", PasswordFile: "/run/secrets/nats-password",
		TokenFile:    "/run/secrets/nats-token",
		NkeySeedFile: "/run/secrets/relay.nk",
		CredsFile:    "/run/secrets/relay.creds",
	}
	if cfg.NATSCredentials != want {
		t.Errorf("NATSCredentials = %#v, want %#v", cfg.NATSCredentials, want)
	}
	if cfg.NATSCAFile != "/etc/switchboard/nats-ca.pem" {
		t.Errorf("NATSCAFile = %q", cfg.NATSCAFile)
	}
}

func TestServeRefusesOpenEmbeddedNATSWithoutCredentials(t *testing.T) {
	err := Main(context.Background(), []string{"serve",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data", t.TempDir(),
		"--nats-listen", "0.0.0.0:4333",
	}, io.Discard, io.Discard)
	if err == nil {
		t.Fatal("serve started an embedded NATS open to other machines without credentials")
	}
	for _, want := range []string{"without credentials", "--nats-password-file", "--nats-listen :4333"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not mention %q", err, want)
		}
	}
}

func TestServeNATSReplicas(t *testing.T) {
	fs := newFlagSet("serve", io.Discard)
	var cfg node.Config
	var logf logFlags
	serveFlags(fs, &cfg, &logf)
	if err := fs.Parse([]string{"--nats-replicas", "3"}); err != nil || cfg.NATSReplicas != 3 {
		t.Fatalf("--nats-replicas 3: %d, %v", cfg.NATSReplicas, err)
	}
	err := Main(context.Background(), []string{"serve",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data", t.TempDir(),
		"--nats-replicas", "3",
	}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "embedded NATS server is a single node") {
		t.Fatalf("three replicas on the embedded server: %v", err)
	}
}
