package node_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
)

// TestUserCredentialsNeverReachTheDevice: whichever credential header lets
// a request in, the others are taken off too; the device's own
// Authorization stays.
func TestUserCredentialsNeverReachTheDevice(t *testing.T) {
	seen := make(chan http.Header, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
	}))
	defer backend.Close()
	n := startNode(t, func(c *node.Config) { c.AllowAnonymousUsers = false })
	startAgent(t, n, backend.URL, agent.ProtocolNative)
	mint := func(name string, devices ...string) string {
		secret, _, err := n.Tokens().Create(context.Background(), auth.CreateRequest{Kind: auth.KindUser, Name: name, Devices: devices})
		if err != nil {
			t.Fatal(err)
		}
		return secret
	}
	scoped, all := mint("alice", device), mint("everything")
	for _, h := range []http.Header{
		{node.UserTokenHeader: {scoped}, "Authorization": {"bearer " + all}},
		{"Authorization": {"Bearer device-own", "BEARER " + scoped}, "Proxy-Authorization": {"Bearer " + all}},
		{"Proxy-Authorization": {"Bearer " + scoped}, node.UserTokenHeader: {all}, "Authorization": {"Bearer device-own"}},
	} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+n.Addr()+"/client/"+device+"/x", nil)
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%v: %s", h, resp.Status)
		}
		got := <-seen
		for _, tok := range []string{scoped, all} {
			for k, vv := range got {
				if strings.Contains(strings.Join(vv, " "), tok) {
					t.Errorf("sent %v: the device got a token in %s", h, k)
				}
			}
		}
		if own := h.Get("Authorization") == "Bearer device-own"; own && got.Get("Authorization") != "Bearer device-own" {
			t.Errorf("sent %v: the device's own Authorization is %q", h, got.Values("Authorization"))
		}
	}
}
