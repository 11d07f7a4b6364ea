package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/ports"
)

// memPorts is a PortStore in memory, with the errors of ports.Store.
type memPorts struct {
	mu sync.Mutex // guards m
	m  map[string]ports.Mapping
}

func newMemPorts(ms ...ports.Mapping) *memPorts {
	p := &memPorts{m: map[string]ports.Mapping{}}
	for _, m := range ms {
		p.m[m.Key()] = m
	}
	return p
}

func (p *memPorts) Add(_ context.Context, m ports.Mapping) error {
	if err := m.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.m[m.Key()]; ok {
		return fmt.Errorf("%s port %d: %w", m.Network, m.Port, ports.ErrMapped)
	}
	p.m[m.Key()] = m
	return nil
}

func (p *memPorts) Remove(_ context.Context, network string, port int) (ports.Mapping, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.m[ports.Key(network, port)]
	if !ok {
		return ports.Mapping{}, fmt.Errorf("%s port %d: %w", network, port, ports.ErrNotMapped)
	}
	delete(p.m, m.Key())
	return m, nil
}

func (p *memPorts) List() []ports.Mapping {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ports.Mapping
	for _, m := range p.m {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b ports.Mapping) int { return strings.Compare(a.Key(), b.Key()) })
	return out
}

func TestPorts(t *testing.T) {
	f := newFixture(t)
	store := newMemPorts()
	srv := httptest.NewServer(NewHandler(Config{Tokens: f.tokens, Ports: store, OwnPorts: func() []int { return []int{8080, 9090} }}))
	t.Cleanup(srv.Close)
	f.srv = srv
	tests := []struct {
		name         string
		method, path string
		body         string
		status       int
		says         string // in the error's message
	}{
		{"map", "POST", PathPorts, `{"port": 2222, "target": "robot-1/ssh"}`, 201, ""},
		{"mapped already", "POST", PathPorts, `{"port": 2222, "target": "robot-2/ssh"}`, 409, "mapped already"},
		{"udp beside tcp", "POST", PathPorts, `{"port": 2222, "network": "udp", "target": "robot-1/dns"}`, 201, ""},
		{"own public port", "POST", PathPorts, `{"port": 8080, "target": "robot-1/ssh"}`, 409, "8080"},
		{"own admin port", "POST", PathPorts, `{"port": 9090, "target": "robot-1/ssh"}`, 409, "own listener"},
		{"bad port", "POST", PathPorts, `{"port": 70000, "target": "robot-1/ssh"}`, 400, "1 to 65535"},
		{"bad target", "POST", PathPorts, `{"port": 2223, "target": "robot-1"}`, 400, "invalid port mapping"},
		{"bad network", "POST", PathPorts, `{"port": 2223, "network": "sctp", "target": "robot-1/ssh"}`, 400, "tcp or udp"},
		{"bad allow", "POST", PathPorts, `{"port": 2223, "target": "robot-1/ssh", "allow": ["lan"]}`, 400, "CIDR"},
		{"unknown field", "POST", PathPorts, `{"port": 2223, "target": "robot-1/ssh", "cidr": "x"}`, 400, "unknown field"},
		{"remove", "DELETE", PathPorts + "/tcp/2222", "", 200, ""},
		{"remove again", "DELETE", PathPorts + "/tcp/2222", "", 404, "not mapped"},
		{"remove bad network", "DELETE", PathPorts + "/sctp/2222", "", 400, "tcp or udp"},
		{"remove bad port", "DELETE", PathPorts + "/tcp/x", "", 400, "1 to 65535"},
	}
	for _, tt := range tests {
		status, body := f.call(t, tt.method, tt.path, f.admin, tt.body)
		if status != tt.status {
			t.Errorf("%s: %d %s, want %d", tt.name, status, body, tt.status)
			continue
		}
		if tt.says != "" && !strings.Contains(decodeError(t, body), tt.says) {
			t.Errorf("%s: %s, want it to say %q", tt.name, body, tt.says)
		}
	}
	c := f.client(f.admin)
	list, err := c.ListPorts(t.Context())
	if err != nil || len(list) != 1 || list[0].Network != "udp" || list[0].Port != 2222 {
		t.Fatalf("list: %+v, %v; want the udp mapping alone", list, err)
	}
	_, err = c.RemovePort(t.Context(), "tcp", 2222)
	if apiErr, ok := errors.AsType[*APIError](err); !ok || apiErr.Status != http.StatusNotFound {
		t.Fatalf("removing an unmapped port: %v, want a 404 APIError", err)
	}
}

func TestPortsWithoutStore(t *testing.T) {
	f := newFixture(t)
	if status, body := f.call(t, "GET", PathPorts, f.admin, ""); status != http.StatusServiceUnavailable {
		t.Fatalf("no store: %d %s, want 503", status, body)
	}
}
