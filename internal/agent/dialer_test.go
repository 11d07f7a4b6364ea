package agent

import (
	"context"
	"errors"
	"net"
	"net/url"
	"reflect"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/flows"
	"github.com/switchboard-relay/switchboard/internal/service"
)

// TestBackendIsTheHTTPService: --backend, with --backend-h2c and its path,
// becomes the service named service.Default; --service adds others, and
// one that takes its name is refused.
func TestBackendIsTheHTTPService(t *testing.T) {
	ssh, _ := service.Parse("ssh=tcp://127.0.0.1:22")
	for _, c := range []struct {
		backend string
		h2c     bool
		want    service.Service
	}{
		{"http://127.0.0.1:3000/base/", false, service.Service{Name: "http", Kind: service.HTTP, Addr: "127.0.0.1:3000", Path: "/base"}},
		{"http://127.0.0.1:50051", true, service.Service{Name: "http", Kind: service.HTTP, Addr: "127.0.0.1:50051", H2C: true}},
		{"https://api.local", false, service.Service{Name: "http", Kind: service.HTTP, Addr: "api.local:443", TLS: true, ServerName: "api.local"}},
	} {
		u, _ := url.Parse(c.backend)
		cfg := Config{Backend: u, BackendH2C: c.h2c, Services: []service.Service{ssh}}
		got, err := cfg.services()
		if err != nil {
			t.Fatalf("%s: %v", c.backend, err)
		}
		if len(got) != 2 || !reflect.DeepEqual(got[0], c.want) || !reflect.DeepEqual(got[1], ssh) {
			t.Errorf("%s: services %+v, want %+v then ssh", c.backend, got, c.want)
		}
	}
	dup, _ := service.Parse("http=tcp://127.0.0.1:80")
	u, _ := url.Parse("http://127.0.0.1:3000")
	cfg := Config{Backend: u, Services: []service.Service{dup}}
	if _, err := cfg.services(); err == nil {
		t.Fatal("a --service named http beside --backend was taken")
	}
}

// TestDialStream: a stream naming a service the agent lacks fails with
// service.ErrUnknown; a known one is dialled.
func TestDialStream(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	db, _ := service.Parse("db=tcp://" + lis.Addr().String())
	u, _ := url.Parse("http://127.0.0.1:1")
	a, err := New(Config{Relays: []*url.URL{u}, Device: "dev", Backend: u, Services: []service.Service{db}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.dialStream(context.Background(), "nope"); !errors.Is(err, service.ErrUnknown) {
		t.Fatalf("unknown service: %v", err)
	}
	c, err := a.dialStream(context.Background(), "db")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// TestPassthroughServices: --tls-passthrough marks tcp:// services alone,
// and names a service the agent has.
func TestPassthroughServices(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:3000")
	var list []service.Service
	for _, spec := range []string{"web=tcp://127.0.0.1:8443", "db=tls://db.local:5432", "voice=udp://127.0.0.1:9", "ssh=tcp://127.0.0.1:22"} {
		sv, err := service.Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, sv)
	}
	cfg := Config{Backend: u, Services: list, Passthrough: []string{"web"}}
	got, err := cfg.services()
	if err != nil {
		t.Fatal(err)
	}
	for _, sv := range got {
		if sv.Passthrough != (sv.Name == "web") {
			t.Errorf("%s: passthrough %v", sv.Name, sv.Passthrough)
		}
	}
	for _, name := range []string{"db", "voice", "http", "nope"} {
		cfg := Config{Backend: u, Services: list, Passthrough: []string{name}}
		if _, err := cfg.services(); err == nil {
			t.Errorf("--tls-passthrough %s was taken", name)
		}
	}
}

// TestDialUDPService: a udp:// service is dialled as a connected UDP
// socket, for the stream's flow.
func TestDialUDPService(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	voice, _ := service.Parse("voice=udp://" + pc.LocalAddr().String())
	u, _ := url.Parse("http://127.0.0.1:1")
	a, err := New(Config{Relays: []*url.URL{u}, Device: "dev", Backend: u, Services: []service.Service{voice}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.dialStream(context.Background(), "voice")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, ok := c.(*flows.Socket)
	if !ok || s.RemoteAddr().String() != pc.LocalAddr().String() || s.LocalAddr().Network() != "udp" {
		t.Fatalf("dialled %T to %v, want a *flows.Socket connected to %v", c, c.RemoteAddr(), pc.LocalAddr())
	}
}
