package sni

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/tlsconf/tlstest"
)

// A real TLS client's hello is read, its name taken, and the bytes
// replayed to a real TLS server complete the handshake: the relay in the
// middle holds no key.
func TestReadHelloThenPassThrough(t *testing.T) {
	ca := tlstest.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, "ssh--robot-1.tls.example.com")
	serverCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	backend, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serverCert}})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		c, err := backend.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()

	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	got := make(chan Hello, 1)
	go func() {
		c, err := front.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		h, err := ReadHello(context.Background(), c)
		got <- h
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", backend.Addr().String())
		if err != nil {
			return
		}
		defer b.Close()
		b.Write(h.Raw)
		go io.Copy(b, c)
		io.Copy(c, b)
	}()

	conn, err := tls.Dial("tcp", front.Addr().String(), &tls.Config{
		ServerName: "ssh--robot-1.tls.example.com", RootCAs: ca.Pool(), NextProtos: []string{"x-test"},
	})
	if err != nil {
		t.Fatalf("handshake through the SNI router: %v", err)
	}
	defer conn.Close()
	conn.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	h := <-got
	if h.ServerName != "ssh--robot-1.tls.example.com" || len(h.ALPN) != 1 || h.ALPN[0] != "x-test" {
		t.Fatalf("hello %+v", h)
	}
	name, err := ParseName(h.ServerName, "tls.example.com")
	if err != nil || name != (Name{Service: "ssh", Device: "robot-1"}) {
		t.Fatalf("name %+v, %v", name, err)
	}
}

func TestReadHelloRejects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input []byte
		want  string
	}{
		{"plain HTTP", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "not a TLS ClientHello"},
		{"garbage record", append([]byte{22, 3, 1, 0, 5}, 1, 2, 3, 4, 5), "not a TLS ClientHello"},
		{"endless records", bytes.Repeat([]byte{22, 3, 1, 0x40, 0}, 1<<14), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := net.Pipe()
			go func() {
				c.Write(tc.input)
				c.Close()
			}()
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			h, err := ReadHello(ctx, s)
			if err == nil {
				t.Fatalf("accepted %+v", h)
			}
			if tc.want != "" && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if len(h.Raw) > MaxHello {
				t.Fatalf("read %d bytes, over %d", len(h.Raw), MaxHello)
			}
		})
	}
}

func TestReadHelloWithoutName(t *testing.T) {
	c, s := net.Pipe()
	go tls.Client(c, &tls.Config{InsecureSkipVerify: true}).Handshake() // an IP address: no SNI
	defer c.Close()
	defer s.Close()
	_, err := ReadHello(context.Background(), s)
	if !errors.Is(err, ErrNoName) {
		t.Fatalf("error %v, want ErrNoName", err)
	}
}

func TestParseName(t *testing.T) {
	for _, tc := range []struct {
		in, zone string
		want     Name
		ok       bool
	}{
		{"ssh--robot-1.tls.example.com", "tls.example.com", Name{"ssh", "robot-1"}, true},
		{"SSH--Robot-1.TLS.example.com.", "tls.example.com", Name{"ssh", "robot-1"}, true},
		{"db--lab--rig.tls.example.com", "tls.example.com", Name{"db", "lab--rig"}, true},
		{"robot-1.tls.example.com", "tls.example.com", Name{}, false},
		{"ssh--.tls.example.com", "tls.example.com", Name{}, false},
		{"--robot.tls.example.com", "tls.example.com", Name{}, false},
		{"ssh--robot.a.tls.example.com", "tls.example.com", Name{}, false},
		{"ssh--robot.example.org", "tls.example.com", Name{}, false},
		{"ssh--robot.evil-tls.example.com", "tls.example.com", Name{}, false},
	} {
		got, err := ParseName(tc.in, tc.zone)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseName(%q) = %+v, %v", tc.in, got, err)
		}
		outside := strings.HasSuffix(tc.in, ".example.org") || strings.Contains(tc.in, "evil-")
		if errors.Is(err, ErrNotInZone) != outside {
			t.Errorf("ParseName(%q): %v; outside the zone: %v", tc.in, err, outside)
		}
	}
}

func FuzzReadHello(f *testing.F) {
	// A real hello as the seed.
	c, s := net.Pipe()
	go tls.Client(c, &tls.Config{ServerName: "ssh--robot.tls.example.com", InsecureSkipVerify: true}).Handshake()
	h, _ := ReadHello(context.Background(), s)
	c.Close()
	f.Add(h.Raw)
	f.Fuzz(func(t *testing.T, input []byte) {
		c, s := net.Pipe()
		go func() {
			c.Write(input)
			c.Close()
		}()
		defer s.Close()
		h, err := ReadHello(context.Background(), s)
		if len(h.Raw) > MaxHello || len(h.Raw) > len(input) {
			t.Fatalf("read %d bytes of %d", len(h.Raw), len(input))
		}
		if err == nil && h.ServerName == "" {
			t.Fatal("a hello without a name accepted")
		}
	})
}
