// Package sni routes TLS connections by the name the client asks for,
// without decrypting them: it reads the ClientHello, takes its server
// name, and hands back every byte it read so that the connection can be
// passed on whole to the service that terminates TLS.
//
// The ClientHello is parsed by crypto/tls itself: a server handshake runs
// over a connection that records what it reads and swallows what the
// handshake would write, and stops at the hello. The relay holds no key.
package sni

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// MaxHello bounds the bytes read while looking for the ClientHello.
const MaxHello = 64 << 10

// ErrNotInZone means a server name is not under the zone ParseName was
// given: the name is for someone else (the relay itself, say).
var ErrNotInZone = errors.New("the server name is not under the zone")

// ErrNoName means the ClientHello names no server.
var ErrNoName = errors.New("the TLS client sent no server name (SNI)")

// errGotHello stops the handshake once the hello is read.
var errGotHello = errors.New("sni: got the hello")

// Hello is what ReadHello learned.
type Hello struct {
	ServerName string
	ALPN       []string
	// Raw is every byte read from the connection: replay it first.
	Raw []byte
}

// ReadHello reads a TLS ClientHello from conn and returns its server name
// and the bytes read. It reads no more than MaxHello bytes and gives up at
// the deadline of ctx (or after 10 s); conn's deadline is cleared after.
func ReadHello(ctx context.Context, conn net.Conn) (Hello, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	rec := &recorder{Conn: conn, limit: MaxHello}
	var hello Hello
	srv := tls.Server(rec, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello.ServerName = h.ServerName
			hello.ALPN = append([]string(nil), h.SupportedProtos...)
			return nil, errGotHello
		},
	})
	err := srv.HandshakeContext(ctx)
	hello.Raw = rec.buf.Bytes()
	switch {
	case errors.Is(err, errGotHello):
	case rec.err != nil:
		return hello, rec.err
	case err == nil:
		return hello, errors.New("sni: handshake completed without a key") // cannot happen
	default:
		return hello, fmt.Errorf("not a TLS ClientHello: %w", err)
	}
	if hello.ServerName == "" {
		return hello, ErrNoName
	}
	return hello, nil
}

// recorder reads through to the connection, keeping a copy, and swallows
// writes (the handshake's alerts are not for the client: the service it
// reaches will answer).
type recorder struct {
	net.Conn
	buf   bytes.Buffer
	limit int
	err   error // why reading stopped, from the connection or the limit
}

func (r *recorder) Read(p []byte) (int, error) {
	if r.buf.Len() >= r.limit {
		r.err = fmt.Errorf("no ClientHello within the first %d bytes", r.limit)
		return 0, r.err
	}
	p = p[:min(len(p), r.limit-r.buf.Len())]
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}

func (r *recorder) Write(p []byte) (int, error) { return len(p), nil }

// Name is a TLS server name split into a device's service: names look
// like SERVICE--DEVICE.ZONE.
type Name struct {
	Service, Device string
}

// ParseName splits a server name under zone (e.g. "tls.example.com") into
// service and device. Case does not matter. A name not under zone is
// ErrNotInZone; one under it but not of that form is another error.
func ParseName(serverName, zone string) (Name, error) {
	host := strings.ToLower(strings.TrimSuffix(serverName, "."))
	zone = strings.ToLower(strings.Trim(zone, "."))
	label, ok := strings.CutSuffix(host, "."+zone)
	if !ok || zone == "" {
		return Name{}, fmt.Errorf("server name %q: %w %q: use SERVICE--DEVICE.%s", serverName, ErrNotInZone, zone, zone)
	}
	service, device, ok := strings.Cut(label, "--")
	if !ok || service == "" || device == "" || strings.Contains(device, ".") {
		return Name{}, fmt.Errorf("server name %q: use SERVICE--DEVICE.%s", serverName, zone)
	}
	return Name{Service: service, Device: device}, nil
}
