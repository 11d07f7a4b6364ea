package proxyproto

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// The header of HAProxy's specification for a TCP over IPv4 connection
// from 192.0.2.7:4321 to 198.51.100.1:443, byte by byte.
var goldenTCP4 = []byte{
	0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a, // signature
	0x21,       // version 2, PROXY
	0x11,       // AF_INET, STREAM
	0x00, 0x0c, // 12 bytes follow
	192, 0, 2, 7, 198, 51, 100, 1, // source, destination
	0x10, 0xe1, 0x01, 0xbb, // ports 4321, 443
}

func TestAppendGolden(t *testing.T) {
	got, err := Append(nil, Header{Source: netip.MustParseAddrPort("192.0.2.7:4321"), Destination: netip.MustParseAddrPort("198.51.100.1:443")})
	if err != nil || !bytes.Equal(got, goldenTCP4) {
		t.Fatalf("got % x, %v\nwant % x", got, err, goldenTCP4)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Source: netip.MustParseAddrPort("192.0.2.7:4321"), Destination: netip.MustParseAddrPort("198.51.100.1:443")},
		{UDP: true, Source: netip.MustParseAddrPort("192.0.2.7:4321"), Destination: netip.MustParseAddrPort("198.51.100.1:53")},
		{Source: netip.MustParseAddrPort("[2001:db8::1]:1"), Destination: netip.MustParseAddrPort("[2001:db8::2]:65535")},
		{UDP: true, Source: netip.MustParseAddrPort("[2001:db8::1]:1"), Destination: netip.MustParseAddrPort("[::1]:9")},
		{Local: true},
	} {
		b, err := Append(nil, h)
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(io.MultiReader(bytes.NewReader(b), strings.NewReader("rest")))
		got, err := Read(r)
		if err != nil || got != h {
			t.Errorf("read %+v, %v; want %+v", got, err, h)
		}
		if rest, _ := io.ReadAll(r); string(rest) != "rest" {
			t.Errorf("after the header: %q", rest)
		}
	}
	// An IPv4-mapped address is IPv4.
	b, _ := Append(nil, Header{Source: netip.MustParseAddrPort("[::ffff:192.0.2.7]:4321"), Destination: netip.MustParseAddrPort("198.51.100.1:443")})
	if !bytes.Equal(b, goldenTCP4) {
		t.Errorf("mapped: % x", b)
	}
	if _, err := Append(nil, Header{Source: netip.MustParseAddrPort("192.0.2.7:1"), Destination: netip.MustParseAddrPort("[::1]:2")}); err == nil {
		t.Error("mixed families accepted")
	}
}

func TestReadRejects(t *testing.T) {
	long := append(append([]byte{}, goldenTCP4[:14]...), 0xff, 0xff)
	for _, tc := range []struct {
		name  string
		input []byte
		want  error
		text  string
	}{
		{"HTTP", []byte("GET / HTTP/1.1\r\n\r\n"), ErrNoHeader, ""},
		{"version 1", []byte("PROXY TCP4 192.0.2.7 198.51.100.1 4321 443\r\n"), ErrNoHeader, ""},
		{"cut", goldenTCP4[:20], nil, "cut short"},
		{"cut in the signature", goldenTCP4[:5], nil, "cut short"},
		{"too long", long, nil, "over the limit"},
		{"bad command", append(append(append([]byte{}, goldenTCP4[:12]...), 0x22), goldenTCP4[13:]...), nil, "version and command"},
		{"short addresses", append(append(append([]byte{}, goldenTCP4[:15]...), 4), goldenTCP4[16:20]...), nil, "bytes of addresses"},
	} {
		_, err := Read(bufio.NewReader(bytes.NewReader(tc.input)))
		if tc.want != nil && !errors.Is(err, tc.want) || tc.text != "" && (err == nil || !strings.Contains(err.Error(), tc.text)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	// Not a header: nothing is consumed.
	r := bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\n\r\n"))
	Read(r)
	if rest, _ := io.ReadAll(r); string(rest) != "GET / HTTP/1.1\r\n\r\n" {
		t.Errorf("consumed: left %q", rest)
	}
}

func FuzzRead(f *testing.F) {
	f.Add(goldenTCP4)
	v6, _ := Append(nil, Header{UDP: true, Source: netip.MustParseAddrPort("[2001:db8::1]:1"), Destination: netip.MustParseAddrPort("[::1]:9")})
	f.Add(v6)
	f.Fuzz(func(t *testing.T, input []byte) {
		h, err := Read(bufio.NewReader(bytes.NewReader(input)))
		if err != nil || h.Local {
			return
		}
		b, err := Append(nil, h)
		if err != nil {
			t.Fatalf("read %+v, which does not encode: %v", h, err)
		}
		again, err := Read(bufio.NewReader(bytes.NewReader(b)))
		if err != nil || again != h {
			t.Fatalf("%+v encodes to % x, which reads as %+v, %v", h, b, again, err)
		}
	})
}

// nginx, told to expect the header, sees the address we send.
func TestNginxReadsOurHeader(t *testing.T) {
	nginx := testkit.Tool(t, "nginx", "SWITCHBOARD_REQUIRE_FRONTDOOR")
	dir := t.TempDir()
	port := freePort(t)
	conf := fmt.Sprintf(`daemon off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    server {
        listen 127.0.0.1:%[2]d proxy_protocol;
        location / { return 200 "$proxy_protocol_addr $proxy_protocol_port"; }
    }
}
`, dir, port)
	start(t, nginx, dir, conf, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", filepath.Join(dir, "conf"))
	conn := dialEventually(t, port)
	defer conn.Close()
	h, _ := Append(nil, Header{Source: netip.MustParseAddrPort("192.0.2.7:4321"), Destination: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))})
	conn.Write(append(h, "GET / HTTP/1.0\r\n\r\n"...))
	resp, _ := io.ReadAll(conn)
	if !bytes.HasSuffix(resp, []byte("\r\n\r\n192.0.2.7 4321")) {
		t.Fatalf("nginx answered %q", resp)
	}
}

// HAProxy's send-proxy-v2 header reads as the connection's real ends.
func TestReadsHAProxysHeader(t *testing.T) {
	haproxy := testkit.Tool(t, "haproxy", "SWITCHBOARD_REQUIRE_FRONTDOOR")
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	got := make(chan Header, 1)
	go func() {
		c, err := backend.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		h, err := Read(r)
		if err != nil {
			t.Errorf("reading HAProxy's header: %v", err)
		}
		got <- h
		line, _ := r.ReadString('\n')
		c.Write([]byte(line))
	}()
	dir := t.TempDir()
	port := freePort(t)
	conf := fmt.Sprintf(`defaults
    mode tcp
    timeout connect 2s
    timeout client 10s
    timeout server 10s
listen in
    bind 127.0.0.1:%d
    server device %s send-proxy-v2
`, port, backend.Addr())
	start(t, haproxy, dir, conf, "-db", "-f", filepath.Join(dir, "conf"))
	conn := dialEventually(t, port)
	defer conn.Close()
	conn.Write([]byte("hello\n"))
	echo, _ := bufio.NewReader(conn).ReadString('\n')
	if echo != "hello\n" {
		t.Fatalf("echo %q", echo)
	}
	h := <-got
	want := Header{Source: netip.MustParseAddrPort(conn.LocalAddr().String()), Destination: netip.MustParseAddrPort(conn.RemoteAddr().String())}
	if h != want {
		t.Fatalf("HAProxy's header reads %+v, want %+v", h, want)
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// start writes conf to dir/conf and runs the program until the test ends.
func start(t *testing.T, bin, dir, conf string, args ...string) {
	if err := os.WriteFile(filepath.Join(dir, "conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // nginx forks workers: end them all
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s said:\n%s", filepath.Base(bin), out.String())
		}
	})
}

func dialEventually(t *testing.T, port int) net.Conn {
	var conn net.Conn
	testkit.Eventually(t, 10*time.Second, func() (err error) {
		conn, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		return err
	})
	return conn
}
