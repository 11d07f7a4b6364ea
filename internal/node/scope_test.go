package node_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// TestAccessCodeScopeIsThePathTheDeviceGets: an access code opens the paths
// under its scope on the device, whichever way the request names the
// device. A request naming it by header, whose path reads as
// /client/<device>/<scope>… once decoded, reaches that whole path on the
// device, outside the scope: it is refused.
func TestAccessCodeScopeIsThePathTheDeviceGets(t *testing.T) {
	seen := make(chan string, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.URL.Path
	}))
	defer backend.Close()
	n := startNode(t, func(c *node.Config) { c.AllowAnonymousUsers = false })
	startAgent(t, n, backend.URL, agent.ProtocolNative)
	secret, _, err := n.Tokens().Create(context.Background(), auth.CreateRequest{Kind: auth.KindUser, Name: "alice", Devices: []string{device}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := n.Tokens().Authenticate(secret)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, target, header string
		status               int
		path                 string // the path the device gets
	}{
		{"by path, inside the scope", "/client/" + device + "/ui/x", "", http.StatusOK, "/ui/x"},
		{"by header, inside the scope", "/ui/x", device, http.StatusOK, "/ui/x"},
		{"by path, outside the scope", "/client/" + device + "/api", "", http.StatusForbidden, ""},
		{"by header, a path that reads as the prefix", "/client%2F" + device + "/ui/x", device, http.StatusForbidden, ""},
	} {
		code, _, err := n.IssueCode(p, device, "/ui/", 0)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(http.MethodGet, "http://"+n.Addr()+c.target+"?"+access.CodeParam+"="+url.QueryEscape(code), nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.header != "" {
			req.Header.Set("X-Server-Name", c.header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s: %s, want %d", c.name, resp.Status, c.status)
		}
		if resp.StatusCode == http.StatusOK {
			if got := <-seen; c.path != "" && got != c.path {
				t.Errorf("%s: the device got %q, want %q", c.name, got, c.path)
			}
		}
	}
}
