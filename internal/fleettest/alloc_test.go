package fleettest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
)

// BenchmarkSmallGET measures one small GET direct and through a relay and a
// native agent, all in this process on loopback. Time per request here says
// little (every party shares the process); its allocations do not move with
// the machine's load and are what the garbage collector pays for, so they
// are the figure to watch:
//
//	go test ./internal/fleettest -run '^$' -bench SmallGET -benchmem
func BenchmarkSmallGET(b *testing.B) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	b.Cleanup(backend.Close)
	get := func(b *testing.B, c *http.Client, url string) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Get(url)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	}
	b.Run("direct", func(b *testing.B) {
		get(b, NewClient(b, true), backend.URL+"/small")
	})
	for _, proto := range []string{agent.ProtocolNative, protocolNativeV1} {
		b.Run(proto, func(b *testing.B) {
			r := StartRelay(b)
			StartAgent(b, r, "dev", backend.URL, r.Token(b, auth.KindAgent, "agent", "dev"), protocol(proto))
			r.WaitDevice(b, "dev")
			user := r.Token(b, auth.KindUser, "user")
			c := NewClient(b, true)
			c.Transport = &bearer{token: user, next: c.Transport}
			get(b, c, r.URL+"/client/dev/small")
		})
	}
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (t *bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+t.token)
	return t.next.RoundTrip(req)
}
