package pulse_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/pulse"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// relay serves /healthz as a relay does: a pulse when asked for one,
// else a plain probe's answer; with srv nil, as a relay that predates
// pulses.
func relay(t *testing.T, srv *pulse.Server, tls bool) *httptest.Server {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" && srv != nil && pulse.IsRequest(r) {
			srv.ServeHTTP(w, r)
			return
		}
		io.WriteString(w, "ok\n")
	})
	var ts *httptest.Server
	if tls {
		ts = httptest.NewTLSServer(h)
	} else {
		ts = httptest.NewServer(h)
	}
	t.Cleanup(func() {
		if srv != nil {
			srv.Close()
		}
		ts.Close()
	})
	return ts
}

// peer is the watchdog's side: what the pulse told it.
type peer struct {
	echoes chan time.Duration
	ended  chan error
}

func newPeer() *peer {
	return &peer{echoes: make(chan time.Duration, 16), ended: make(chan error, 1)}
}

// dial opens a pulse to ts, closed when the test ends.
func (p *peer) dial(t *testing.T, ts *httptest.Server) *pulse.Conn {
	t.Helper()
	var tlsConf = ts.Client().Transport.(*http.Transport).TLSClientConfig
	c, err := pulse.Dial(t.Context(), ts.URL, tlsConf, func(rtt time.Duration) { p.echoes <- rtt }, func(err error) { p.ended <- err })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (p *peer) echo(t *testing.T) time.Duration {
	t.Helper()
	select {
	case rtt := <-p.echoes:
		return rtt
	case err := <-p.ended:
		t.Fatalf("the pulse ended waiting for an echo: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no echo within 5 s")
	}
	return 0
}

func (p *peer) end(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.ended:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the pulse did not end within 5 s")
	}
	return nil
}

func TestBeatsComeBack(t *testing.T) {
	for _, tls := range []bool{false, true} {
		name := "http"
		if tls {
			name = "https"
		}
		t.Run(name, func(t *testing.T) {
			ts := relay(t, &pulse.Server{}, tls)
			p := newPeer()
			c := p.dial(t, ts)
			for i := range 3 {
				if err := c.Beat(time.Second); err != nil {
					t.Fatal(err)
				}
				if rtt := p.echo(t); rtt < 0 || rtt > 5*time.Second {
					t.Errorf("beat %d: round trip %v", i, rtt)
				}
			}
			// Several beats at once come back as several echoes.
			for range 5 {
				if err := c.Beat(time.Second); err != nil {
					t.Fatal(err)
				}
			}
			for range 5 {
				p.echo(t)
			}
			if err := c.Close(); err != nil {
				t.Error(err)
			}
			select {
			case err := <-p.ended:
				t.Errorf("ended told %v of a pulse that Close ended", err)
			default:
			}
		})
	}
}

// TestRelayWithoutPulses: a relay that does not speak the protocol
// answers the upgrade as a plain probe, and Dial says so.
func TestRelayWithoutPulses(t *testing.T) {
	ts := relay(t, nil, false)
	_, err := pulse.Dial(t.Context(), ts.URL, nil, func(time.Duration) {}, func(error) {})
	var he *connect.HandshakeError
	if !errors.As(err, &he) || he.Status != http.StatusOK {
		t.Fatalf("Dial to a relay without pulses: %v, want a handshake error of status 200", err)
	}
}

// TestRelayStopEndsPulses: a relay that stops closes its pulses, and
// its peers are told at once.
func TestRelayStopEndsPulses(t *testing.T) {
	srv := &pulse.Server{}
	ts := relay(t, srv, false)
	p := newPeer()
	c := p.dial(t, ts)
	if err := c.Beat(time.Second); err != nil {
		t.Fatal(err)
	}
	p.echo(t)
	srv.Close()
	if err := p.end(t); err == nil {
		t.Error("ended was told no error")
	}
	if err := c.Beat(time.Second); err == nil {
		t.Error("a beat on an ended pulse was sent")
	}
}

// TestQuietPulseIsClosed: a pulse that sends no beat for the server's
// IdleTimeout is closed, so that a peer gone silent holds nothing.
func TestQuietPulseIsClosed(t *testing.T) {
	ts := relay(t, &pulse.Server{IdleTimeout: 50 * time.Millisecond}, false)
	p := newPeer()
	p.dial(t, ts)
	if err := p.end(t); err == nil {
		t.Error("ended was told no error")
	}
}

// TestNotAPulse: a request to the pulse server that does not ask for the
// upgrade is told what it takes.
func TestNotAPulse(t *testing.T) {
	srv := &pulse.Server{}
	defer srv.Close()
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusUpgradeRequired || rec.Header().Get("Upgrade") != pulse.Protocol {
		t.Errorf("answered %d, Upgrade %q; want 426 naming %s", rec.Code, rec.Header().Get("Upgrade"), pulse.Protocol)
	}
}

// TestEchoOfABeatNeverSent: a peer that sends back what no beat sent is
// not a pulse; the connection ends, and ended says why.
func TestEchoOfABeatNeverSent(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, ok := connect.Hijack(w, pulse.Protocol)
		if !ok {
			return
		}
		defer conn.Close()
		var beat [8]byte
		if _, err := io.ReadFull(conn, beat[:]); err != nil {
			return
		}
		beat[7] += 98 // the first beat is 1: this one, 99, was never sent
		conn.Write(beat[:])
		io.Copy(io.Discard, conn)
	}))
	defer ts.Close()
	p := newPeer()
	c := p.dial(t, ts)
	if err := c.Beat(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.end(t); err == nil {
		t.Error("ended was told no error")
	}
	select {
	case rtt := <-p.echoes:
		t.Errorf("an echo of %v counted", rtt)
	default:
	}
}
