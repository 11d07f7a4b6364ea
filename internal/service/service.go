// Package service names what an agent lets the fleet reach on its device.
// A service is a name and a URL, as `switchboard agent --service NAME=URL`
// gives it: web=http://127.0.0.1:3000, grpc=h2c://127.0.0.1:50051,
// ssh=tcp://127.0.0.1:22, db=tls://db.local:5432, voice=udp://127.0.0.1:9.
//
// The agent dials a service's address; its relay never learns it. What the
// relay needs in order to open streams to a service and speak to it, the
// agent announces in the tunnel's handshake (see Announce): the name, what
// is carried (HTTP/1.1, HTTP/2 cleartext, raw TCP, UDP datagrams) and, for
// HTTP, the path put before every request and the Host to send.
package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// Kind is what a service's streams carry.
type Kind string

// Kinds of services.
const (
	HTTP Kind = "http" // HTTP/1.1 (or HTTP/2 cleartext when H2C): the relay speaks it
	TCP  Kind = "tcp"  // a byte stream, passed through
	UDP  Kind = "udp"  // datagrams, one flow per stream
)

// Default is the name of the service --backend gives: the one HTTP
// requests reach when they name no other.
const Default = "http"

// Service is one of an agent's services.
type Service struct {
	Name string
	Kind Kind
	// Addr is the host:port the agent dials.
	Addr string
	// TLS dials Addr with TLS (https://, tls://), verified with the agent's
	// CAs against ServerName.
	TLS        bool
	ServerName string
	// H2C speaks HTTP/2 with prior knowledge (h2c://), as gRPC servers want.
	H2C bool
	// Path is put before every HTTP request's path (the URL's path).
	Path string
	// Broadcast lists the paths (as users see them) whose GETs every
	// viewer shares: the relay fetches each once and fans it out.
	Broadcast []string
	// Passthrough offers a tcp:// service, a TLS server, to anyone who
	// reaches the relays' TLS listener by its SNI name
	// (SERVICE--DEVICE.ZONE), with no credential: the relay passes the
	// user's TLS connection through whole and the service terminates it
	// and authenticates its users.
	Passthrough bool
}

// Parse reads NAME=URL.
func Parse(s string) (Service, error) {
	name, raw, ok := strings.Cut(s, "=")
	if !ok {
		return Service{}, fmt.Errorf("service %q: want NAME=URL, e.g. ssh=tcp://127.0.0.1:22", s)
	}
	if err := CheckName(name); err != nil {
		return Service{}, err
	}
	sv, err := FromURL(raw)
	if err != nil {
		return Service{}, fmt.Errorf("service %s: %w", name, err)
	}
	sv.Name = name
	return sv, nil
}

// FromURL reads a service's URL; the name is left empty.
func FromURL(raw string) (Service, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Service{}, fmt.Errorf("URL %q: %w", raw, err)
	}
	var sv Service
	port := ""
	switch u.Scheme {
	case "http":
		sv.Kind, port = HTTP, "80"
	case "https":
		sv.Kind, sv.TLS, port = HTTP, true, "443"
	case "h2c":
		sv.Kind, sv.H2C, port = HTTP, true, "80"
	case "tcp":
		sv.Kind = TCP
	case "tls":
		sv.Kind, sv.TLS = TCP, true
	case "udp":
		sv.Kind = UDP
	default:
		return Service{}, fmt.Errorf("URL %q: the scheme must be http, https, h2c, tcp, tls or udp", raw)
	}
	if u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Service{}, fmt.Errorf("URL %q must look like %s://host:port", raw, u.Scheme)
	}
	if u.Port() == "" {
		if port == "" {
			return Service{}, fmt.Errorf("URL %q needs a port", raw)
		}
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	sv.Addr = u.Host
	if sv.TLS {
		sv.ServerName = u.Hostname()
	}
	if sv.Kind == HTTP {
		sv.Path = strings.TrimSuffix(u.EscapedPath(), "/")
	} else if u.Path != "" && u.Path != "/" {
		return Service{}, fmt.Errorf("URL %q: a %s service has no path", raw, sv.Kind)
	}
	return sv, nil
}

// CheckName reports whether name may name a service: a DNS label of
// lowercase letters, digits and single hyphens (it is part of TLS names
// such as SERVICE--DEVICE.ZONE, so "--" may not appear in it).
func CheckName(name string) error {
	bad := len(name) == 0 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' || strings.Contains(name, "--")
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("service name %q: use 1 to 63 lowercase letters, digits and single hyphens, e.g. ssh or web-ui", name)
	}
	return nil
}

// Announced is what the relay learns of a service.
type Announced struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	H2C  bool   `json:"h2c,omitempty"`
	// Path and Host are for HTTP: Path is put before every request's path;
	// Host, if set, is sent in place of the user's Host.
	Path string `json:"path,omitempty"`
	Host string `json:"host,omitempty"`
	// Broadcast, for HTTP, lists the paths whose GETs every viewer shares.
	Broadcast []string `json:"broadcast,omitempty"`
	// Passthrough, for TCP, says the device's owner lets anyone reach the
	// service by TLS passthrough, with no credential.
	Passthrough bool `json:"passthrough,omitempty"`
}

// Outgoing returns a shallow copy of req addressed to the announced HTTP
// service a: its path behind a's Path (path is a.Path unescaped, the
// caller's once-parsed copy), and its Host a's when a names one, else the
// user's (req.URL.Host when the request has none). The URL's scheme and
// host are placeholders: the stream, not the URL, says where it goes.
func (a Announced) Outgoing(req *http.Request, path string) *http.Request {
	out := req.WithContext(req.Context()) // a shallow copy: the URL and Host change
	u := *req.URL
	u.Scheme, u.Host = "http", "service"
	if a.Path != "" {
		u.RawPath = a.Path + req.URL.EscapedPath()
		u.Path = path + req.URL.Path
	}
	out.URL = &u
	if a.Host != "" {
		out.Host = a.Host
	} else if out.Host == "" {
		out.Host = req.URL.Host
	}
	return out
}

// Limits of an announcement, so that a relay reads it in bounded memory.
const (
	MaxServices     = 64
	MaxAnnouncement = 8 << 10
)

// Announce encodes what the relay learns of services: one header value.
// preserveHost keeps the user's Host; otherwise an HTTP service is sent
// the Host of its own address.
func Announce(services []Service, preserveHost bool) (string, error) {
	list := make([]Announced, 0, len(services))
	for _, sv := range services {
		a := Announced{Name: sv.Name, Kind: sv.Kind, H2C: sv.H2C, Passthrough: sv.Passthrough}
		if sv.Kind == HTTP {
			a.Path = sv.Path
			a.Broadcast = sv.Broadcast
			if !preserveHost {
				a.Host = sv.Addr
			}
		}
		list = append(list, a)
	}
	if _, err := check(list); err != nil {
		return "", err
	}
	b, err := json.Marshal(list)
	if err != nil {
		return "", err
	}
	if len(b) > MaxAnnouncement {
		return "", fmt.Errorf("the services' announcement takes %d bytes, over the limit of %d", len(b), MaxAnnouncement)
	}
	return string(b), nil
}

// ParseAnnouncement decodes and checks what Announce encoded. The map it
// returns may be shared with other callers that parsed the same
// announcement, and must not be modified: the agents of a fleet mostly
// announce the same services, and one parsed map costs a relay about a
// KiB for each agent it holds.
func ParseAnnouncement(v string) (map[string]Announced, error) {
	if len(v) > MaxAnnouncement {
		return nil, fmt.Errorf("services announcement of %d bytes, over the limit of %d", len(v), MaxAnnouncement)
	}
	if m, ok := parsed.get(v); ok {
		return m, nil
	}
	var list []Announced
	if err := json.Unmarshal([]byte(v), &list); err != nil {
		return nil, fmt.Errorf("services announcement: %w", err)
	}
	m, err := check(list)
	if err == nil {
		parsed.put(v, m)
	}
	return m, err
}

// Bounds of the announcements ParseAnnouncement keeps to share: beyond
// them it parses each one anew.
const (
	maxShared      = 1024
	maxSharedBytes = 256 << 10
)

// parsed holds the announcements ParseAnnouncement parsed, by their text.
var parsed sharedAnnouncements

type sharedAnnouncements struct {
	mu    sync.Mutex // guards the fields below
	m     map[string]map[string]Announced
	bytes int
}

func (s *sharedAnnouncements) get(v string) (map[string]Announced, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.m[v]
	return m, ok
}

func (s *sharedAnnouncements) put(v string, m map[string]Announced) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= maxShared || s.bytes+len(v) > maxSharedBytes {
		return
	}
	if s.m == nil {
		s.m = map[string]map[string]Announced{}
	}
	if _, ok := s.m[v]; !ok {
		s.m[v] = m
		s.bytes += len(v)
	}
}

func check(list []Announced) (map[string]Announced, error) {
	if len(list) > MaxServices {
		return nil, fmt.Errorf("%d services, over the limit of %d", len(list), MaxServices)
	}
	byName := make(map[string]Announced, len(list))
	for _, a := range list {
		if err := CheckName(a.Name); err != nil {
			return nil, err
		}
		if _, dup := byName[a.Name]; dup {
			return nil, fmt.Errorf("service %s is named twice", a.Name)
		}
		if a.Passthrough && a.Kind != TCP {
			return nil, fmt.Errorf("service %s: only a tcp service is offered for TLS passthrough, not a %s one", a.Name, a.Kind)
		}
		switch a.Kind {
		case HTTP:
		case TCP, UDP:
			if a.H2C || a.Path != "" || a.Host != "" || len(a.Broadcast) > 0 {
				return nil, fmt.Errorf("service %s: a %s service has no h2c, path, host or broadcast paths", a.Name, a.Kind)
			}
		default:
			return nil, fmt.Errorf("service %s: unknown kind %q", a.Name, a.Kind)
		}
		if a.Path != "" && (!strings.HasPrefix(a.Path, "/") || strings.ContainsAny(a.Path, "?#\x00\r\n")) {
			return nil, fmt.Errorf("service %s: path %q must start with / and hold no query", a.Name, a.Path)
		}
		if len(a.Broadcast) > MaxServices {
			return nil, fmt.Errorf("service %s: %d broadcast paths, over the limit of %d", a.Name, len(a.Broadcast), MaxServices)
		}
		for _, b := range a.Broadcast {
			if !strings.HasPrefix(b, "/") || strings.ContainsAny(b, "?# \x00\r\n") {
				return nil, fmt.Errorf("service %s: broadcast path %q must start with / and hold no query or spaces", a.Name, b)
			}
		}
		if strings.ContainsAny(a.Host, "/?#@ \x00\r\n") {
			return nil, fmt.Errorf("service %s: host %q is not a host[:port]", a.Name, a.Host)
		}
		byName[a.Name] = a
	}
	return byName, nil
}

// ErrUnknown means a stream named a service the agent does not have.
var ErrUnknown = errors.New("no such service")
