package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/bench/internal/benchkit"
	"github.com/switchboard-relay/switchboard/bench/internal/procfleet"
)

// A frontDoor is a real balancer process in front of the relays.
type frontDoor struct {
	kind string // "nginx" or "haproxy"
	url  string // where agents and users go
	proc *procfleet.Proc
	log  string // its output
}

// Kinds of front door.
const (
	kindNginx   = "nginx"
	kindHAProxy = "haproxy"
)

// frontDoorTool finds the balancer's binary: $SWITCHBOARD_NGINX or
// $SWITCHBOARD_HAPROXY, else the PATH, else /usr/sbin (Debian's place, often
// not on a user's PATH).
func frontDoorTool(kind string) (string, error) {
	if p := os.Getenv("SWITCHBOARD_" + strings.ToUpper(kind)); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath(kind); err == nil {
		return p, nil
	}
	p := "/usr/sbin/" + kind
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s: not on PATH nor in /usr/sbin (apt-get install %s, or set SWITCHBOARD_%s)", kind, kind, strings.ToUpper(kind))
	}
	return p, nil
}

// startFrontDoor renders the balancer's config for the relays into dir and
// runs the balancer in the foreground until stop.
func startFrontDoor(ctx context.Context, kind, root, dir string, relays []*procfleet.Relay) (*frontDoor, error) {
	bin, err := frontDoorTool(kind)
	if err != nil {
		return nil, err
	}
	port := benchkit.FreePort()
	var args []string
	switch kind {
	case kindNginx:
		conf, err := nginxConfig(root, dir, port, relays)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		args = []string{"-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;"}
	case kindHAProxy:
		conf, err := haproxyConfig(root, port, benchkit.FreePort(), relays)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(dir, "haproxy.cfg")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		// -n: the shipped maxconn (100000) needs more file descriptors
		// than a test machine may give; the rest is the file's.
		args = []string{"-db", "-n", "4096", "-f", path}
	default:
		return nil, fmt.Errorf("front door %q: want nginx or haproxy", kind)
	}
	f := &frontDoor{kind: kind, url: "http://127.0.0.1:" + port, log: filepath.Join(dir, kind+".log")}
	out, err := os.Create(f.log)
	if err != nil {
		return nil, err
	}
	f.proc, err = procfleet.StartProc(kind, bin, args, out)
	out.Close() // the process holds its own descriptor
	if err != nil {
		return nil, err
	}
	err = benchkit.Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
		if f.proc.Exited() {
			b, _ := os.ReadFile(f.log)
			return fmt.Errorf("%s exited: %s", kind, b)
		}
		resp, err := http.Get(f.url + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
	if err != nil {
		f.stop()
		return nil, fmt.Errorf("%s did not come up: %w", kind, err)
	}
	return f, nil
}

func (f *frontDoor) stop() { f.proc.Stop(5 * time.Second) }

// nginxSnippet reads the maps that define $switchboard_device from
// docs/deploy.md (the ingress-nginx http-snippet), so that the harness
// hashes exactly as the documented front door does.
func nginxSnippet(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "docs", "deploy.md"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	var b strings.Builder
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "http-snippet: |":
			in = true
		case in && strings.TrimSpace(line) == "```":
			if !strings.Contains(b.String(), "$switchboard_device") {
				break
			}
			return b.String(), nil
		case in:
			b.WriteString(strings.TrimSpace(line) + "\n")
		}
	}
	return "", errors.New("docs/deploy.md: no http-snippet defining $switchboard_device")
}

// nginxConfig is Debian's nginx as the chart's front door: the documented
// maps, a consistent hash on $switchboard_device, and what upgrades, long
// polls and streams need (HTTP/1.1 upstream, the Upgrade and Connection
// headers, no buffering, long timeouts), as the Ingress's annotations set.
func nginxConfig(root, dir, port string, relays []*procfleet.Relay) (string, error) {
	maps, err := nginxSnippet(root)
	if err != nil {
		return "", err
	}
	var servers strings.Builder
	for _, r := range relays {
		fmt.Fprintf(&servers, "        server %s:%s max_fails=1 fail_timeout=10s;\n", r.Host, r.Port)
	}
	return fmt.Sprintf(`worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
%[2]s
    map $http_upgrade $connection_upgrade { default upgrade; "" ""; }
    upstream relays {
        hash $switchboard_device consistent;
%[3]s        keepalive 64;
    }
    server {
        listen 127.0.0.1:%[4]s;
        location / {
            proxy_pass http://relays;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_connect_timeout 2s;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
            proxy_next_upstream error timeout;
        }
    }
}
`, dir, indent(maps, "    "), servers.String(), port), nil
}

func indent(s, by string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString(by + line)
	}
	return b.String()
}

var (
	haproxyServer  = regexp.MustCompile(`(?m)^\s*server relay-\S+ .*\n`)
	haproxyPublic  = regexp.MustCompile(`(?m)^(\s*bind) :8443$`)
	haproxyMonitor = regexp.MustCompile(`(?m)^(\s*bind) 127\.0\.0\.1:8404$`)
)

// haproxyConfig is deploy/bare-metal/haproxy.cfg with the harness's
// addresses: its listeners on loopback ports and one server line per relay
// (public port, and the admin port for /readyz). Everything else is the
// file as shipped.
func haproxyConfig(root, port, monitor string, relays []*procfleet.Relay) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "deploy", "bare-metal", "haproxy.cfg"))
	if err != nil {
		return "", err
	}
	cfg := string(b)
	if !haproxyPublic.MatchString(cfg) || !haproxyMonitor.MatchString(cfg) || len(haproxyServer.FindAllString(cfg, -1)) == 0 {
		return "", errors.New("deploy/bare-metal/haproxy.cfg: no 'bind :8443', 'bind 127.0.0.1:8404' or server lines to fill in")
	}
	cfg = haproxyPublic.ReplaceAllString(cfg, "${1} 127.0.0.1:"+port)
	cfg = haproxyMonitor.ReplaceAllString(cfg, "${1} 127.0.0.1:"+monitor)
	var servers strings.Builder
	for _, r := range relays {
		fmt.Fprintf(&servers, "    server relay-%d %s:%s check addr %s port %s\n", r.N, r.Host, r.Port, r.Host, r.AdminPort)
	}
	first := true
	cfg = haproxyServer.ReplaceAllStringFunc(cfg, func(string) string {
		if first {
			first = false
			return servers.String()
		}
		return ""
	})
	return cfg, nil
}
