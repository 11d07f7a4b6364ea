package agent

import (
	"net/http"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/topic"
)

// broadcastMarker marks the backend's answers to GETs of the paths the
// agent was told are broadcasts (Config.BroadcastPaths), so that the
// relay fetches each such stream once and shares it among its viewers.
type broadcastMarker struct {
	next   http.RoundTripper
	prefix string   // the backend URL's own path, before every request's
	paths  []string // device paths, as users see them
}

func (m *broadcastMarker) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := m.next.RoundTrip(r)
	if err == nil && r.Method == http.MethodGet && m.marks(r.URL.Path) {
		resp.Header.Set(topic.BroadcastHeader, "1")
	}
	return resp, err
}

// marks reports whether the backend path p is one of the broadcast paths.
func (m *broadcastMarker) marks(p string) bool {
	p = strings.TrimPrefix(p, m.prefix)
	for _, b := range m.paths {
		if p == b {
			return true
		}
	}
	return false
}

// CloseIdleConnections closes the backend's idle connections.
func (m *broadcastMarker) CloseIdleConnections() {
	if c, ok := m.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
