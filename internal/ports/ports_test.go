package ports

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/datagram"
	"github.com/switchboard-relay/switchboard/internal/lograte"
	"github.com/switchboard-relay/switchboard/internal/proxyproto"
	"github.com/switchboard-relay/switchboard/internal/store"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func openStore(t *testing.T) (*Store, jetstream.KeyValue) {
	st, err := store.Open(ctx(t), store.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	kv, err := st.KeyValue(ctx(t), Bucket)
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenStore(ctx(t), kv, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, kv
}

// Two relays' stores over one NATS: a port is mapped once, whichever maps
// it, and each sees the other's mappings.
func TestStoreMapsOnce(t *testing.T) {
	a, kv := openStore(t)
	b, err := OpenStore(ctx(t), kv, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m := Mapping{Port: 2222, Network: TCP, Target: "robot-1/ssh", CreatedAt: time.Now().UTC()}
	if err := a.Add(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(ctx(t), Mapping{Port: 2222, Network: TCP, Target: "robot-2/ssh"}); !errors.Is(err, ErrMapped) {
		t.Fatalf("mapping a mapped port: %v", err)
	}
	if err := b.Add(ctx(t), Mapping{Port: 2222, Network: UDP, Target: "robot-2/voice"}); err != nil {
		t.Fatalf("the same number on udp: %v", err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if got := b.List(); len(got) != 2 || got[0].Target != "robot-1/ssh" {
			return fmt.Errorf("b lists %+v", got)
		}
		if got := a.List(); len(got) != 2 {
			return fmt.Errorf("a lists %+v", got)
		}
		return nil
	})
	if _, err := a.Remove(ctx(t), TCP, 2222); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Remove(ctx(t), TCP, 2222); !errors.Is(err, ErrNotMapped) {
		t.Fatalf("removing twice: %v", err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if _, ok := b.Get(TCP, 2222); ok {
			return errors.New("b still has it")
		}
		return nil
	})
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		m    Mapping
		want string
	}{
		{Mapping{Port: 0, Network: TCP, Target: "a/b"}, "use 1 to 65535"},
		{Mapping{Port: 70000, Network: TCP, Target: "a/b"}, "use 1 to 65535"},
		{Mapping{Port: 22, Network: "sctp", Target: "a/b"}, "tcp or udp"},
		{Mapping{Port: 22, Network: TCP, Target: "a"}, "DEVICE/SERVICE"},
		{Mapping{Port: 22, Network: TCP, Target: "a/b", Allow: []string{"nope"}}, "CIDR"},
		{Mapping{Port: 22, Network: UDP, Target: "a/b", ProxyProtocol: true}, "for tcp ports"},
		{Mapping{Port: 22, Network: TCP, Target: "a/b", MaxConns: -1}, "max connections"},
	} {
		err := tc.m.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v", tc.m, err)
		}
	}
	if err := (Mapping{Port: 22, Network: TCP, Target: "a/b", Allow: []string{"10.0.0.0/8", "192.0.2.1"}}).Validate(); err != nil {
		t.Error(err)
	}
}

// device stands for the fleet: it opens a connection to a real TCP echo
// server for robot/echo, a PROXY-reading server for robot/whoami, and a
// datagram echo for robot/voice.
type device struct {
	t     *testing.T
	tcp   map[string]string
	mu    sync.Mutex
	opens int
}

func (d *device) Open(ctx context.Context, target connect.Target) (net.Conn, error) {
	d.mu.Lock()
	d.opens++
	d.mu.Unlock()
	if target.Service == "voice" {
		if target.Network != connect.UDP {
			return nil, fmt.Errorf("%w: %s asked over %q, not udp", connect.ErrUnknownService, target, target.Network)
		}
		a, b := net.Pipe()
		go udpDevice(b)
		return a, nil
	}
	addr, ok := d.tcp[target.Service]
	if !ok {
		return nil, connect.ErrUnknownService
	}
	return net.Dial("tcp", addr)
}

// udpDevice answers each datagram upper-cased, as a device's UDP service
// behind its agent would.
func udpDevice(c net.Conn) {
	defer c.Close()
	r, w := datagram.NewReader(c), datagram.NewWriter(c)
	buf := make([]byte, datagram.MaxSize)
	for {
		n, err := r.Read(buf)
		if err != nil {
			return
		}
		w.Write([]byte(strings.ToUpper(string(buf[:n]))))
	}
}

func serveTCP(t *testing.T, handle func(net.Conn)) string { return testkit.ServeTCP(t, handle) }

func freePort(t *testing.T, network string) int {
	if network == UDP {
		pc, _ := net.ListenPacket("udp", "127.0.0.1:0")
		defer pc.Close()
		return pc.LocalAddr().(*net.UDPAddr).Port
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func newDevice(t *testing.T) *device {
	echo := serveTCP(t, func(c net.Conn) { io.Copy(c, c) })
	whoami := serveTCP(t, func(c net.Conn) {
		h, err := proxyproto.Read(bufio.NewReader(c))
		if err != nil {
			fmt.Fprintf(c, "no header: %v", err)
			return
		}
		fmt.Fprint(c, h.Source.Addr())
	})
	return &device{t: t, tcp: map[string]string{"echo": echo, "whoami": whoami}}
}

func TestTCPPort(t *testing.T) {
	dev := newDevice(t)
	l := &Listeners{Host: "127.0.0.1", Open: dev}
	defer l.Close()
	echoPort, whoPort, closedPort := freePort(t, TCP), freePort(t, TCP), freePort(t, TCP)
	err := l.Apply([]Mapping{
		{Port: echoPort, Network: TCP, Target: "robot/echo", MaxConns: 1},
		{Port: whoPort, Network: TCP, Target: "robot/whoami", ProxyProtocol: true},
		{Port: closedPort, Network: TCP, Target: "robot/echo", Allow: []string{"192.0.2.0/24"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dial := func(port int) net.Conn {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := dial(echoPort)
	defer c.Close()
	c.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	// Over the connection limit: closed at once.
	second := dial(echoPort)
	if n, err := second.Read(buf); err == nil {
		t.Fatalf("second connection over a limit of 1 read %q", buf[:n])
	}
	second.Close()

	// The PROXY header tells the service the user's address.
	who := dial(whoPort)
	got, _ := io.ReadAll(who)
	who.Close()
	if string(got) != "127.0.0.1" {
		t.Fatalf("the service saw %q", got)
	}

	// A source outside the allowlist is closed at once.
	denied := dial(closedPort)
	if n, err := denied.Read(buf); err == nil {
		t.Fatalf("a denied source read %q", buf[:n])
	}
	denied.Close()

	// Unmapped: the port closes, with its connections.
	if err := l.Apply(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); err == nil {
		t.Fatal("a connection through an unmapped port goes on")
	}
	if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", echoPort)); err == nil {
		c.Close()
		t.Fatal("an unmapped port still accepts")
	}
}

func TestPortInUseIsReported(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := busy.Addr().(*net.TCPAddr).Port
	l := &Listeners{Host: "127.0.0.1", Open: newDevice(t)}
	defer l.Close()
	err = l.Apply([]Mapping{{Port: port, Network: TCP, Target: "robot/echo"}})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("tcp port %d for robot/echo", port)) {
		t.Fatalf("mapping a port in use: %v", err)
	}
}

func TestUDPPort(t *testing.T) {
	dev := newDevice(t)
	l := &Listeners{Host: "127.0.0.1", Open: dev, UDPIdle: 200 * time.Millisecond}
	defer l.Close()
	port := freePort(t, UDP)
	if err := l.Apply([]Mapping{{Port: port, Network: UDP, Target: "robot/voice"}}); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2000)
	for _, msg := range []string{"one", strings.Repeat("x", 1400), "three"} {
		c.Write([]byte(msg))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		if err != nil || string(buf[:n]) != strings.ToUpper(msg) {
			t.Fatalf("answer to %.10q: %.10q, %v", msg, buf[:n], err)
		}
	}
	dev.mu.Lock()
	opens := dev.opens
	dev.mu.Unlock()
	if opens != 1 {
		t.Fatalf("%d streams for one flow", opens)
	}
	// Idle past the timeout: the flow ends, and the next datagram opens another.
	testkit.Eventually(t, 5*time.Second, func() error {
		l.mu.Lock()
		p := l.open[Key(UDP, port)].(*udpPort)
		l.mu.Unlock()
		if p.srv.Flows() != 0 {
			return errors.New("the idle flow is still open")
		}
		return nil
	})
	c.Write([]byte("again"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "AGAIN" {
		t.Fatalf("after idle: %q, %v", buf[:n], err)
	}
}

// TestUDPPortOversizedDatagram: a datagram over the most a flow carries
// (IPv6 has them) is dropped and logged, not cut short and passed on; the
// flow goes on.
func TestUDPPortOversizedDatagram(t *testing.T) {
	probe, err := net.ListenPacket("udp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	port := probe.LocalAddr().(*net.UDPAddr).Port
	probe.Close()
	logs := &testkit.Buffer{}
	l := &Listeners{Host: "::1", Open: newDevice(t), Logger: slog.New(slog.NewTextHandler(logs, nil))}
	defer l.Close()
	if err := l.Apply([]Mapping{{Port: port, Network: UDP, Target: "robot/voice"}}); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("udp", fmt.Sprintf("[::1]:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(make([]byte, datagram.MaxSize+13)); err != nil {
		t.Skipf("this host sends no datagram that large over IPv6: %v", err)
	}
	c.Write([]byte("small"))
	buf := make([]byte, 70000)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "SMALL" {
		t.Fatalf("first answer: %d bytes %.10q, %v; want SMALL alone", n, buf[:n], err)
	}
	if !strings.Contains(logs.String(), "datagram dropped: over the 65507 bytes") {
		t.Fatalf("no warning of the oversized datagram:\n%s", logs)
	}
}

// TestRefusalLinesBounded: a source outside the allowlist dialling in a
// loop is closed each time, but logs a few lines a second, not one a
// connection.
func TestRefusalLinesBounded(t *testing.T) {
	logs := &testkit.Buffer{}
	l := &Listeners{Host: "127.0.0.1", Open: newDevice(t), Logger: slog.New(slog.NewTextHandler(logs, nil))}
	defer l.Close()
	port := freePort(t, TCP)
	if err := l.Apply([]Mapping{{Port: port, Network: TCP, Target: "robot/echo", Allow: []string{"192.0.2.0/24"}}}); err != nil {
		t.Fatal(err)
	}
	const dials = 100
	start := time.Now()
	for range dials {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("a denied source's read: %v, want the connection closed", err)
		}
		c.Close()
	}
	bound := lograte.DefaultPerSecond * (int(time.Since(start)/time.Second) + 2) // the seconds begun
	if n := logs.Count("source not allowed"); n == 0 || n > bound {
		t.Fatalf("%d refusal lines for %d connections in %v, want 1 to %d:\n%s", n, dials, time.Since(start), bound, logs)
	}
}
