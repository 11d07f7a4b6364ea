package agent

import (
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

func TestPingDefaultsFollowTheStandby(t *testing.T) {
	slow := tunnel.Liveness{Interval: DefaultStandbyPingInterval, Timeout: DefaultStandbyPingTimeout}
	fast := tunnel.Liveness{}.WithDefaults()
	for _, tc := range []struct {
		name string
		cfg  Config
		want tunnel.Liveness
	}{
		{"a version 2 agent keeps a standby and pings seldom", Config{}, slow},
		{"over a websocket there is no standby", Config{WebSocket: true}, fast},
		{"version 1 has no standby", Config{TunnelVersion: tunnel.V1}, fast},
		{"no standby asked for", Config{NoStandby: true}, fast},
		{"long-poll agents do not ping", Config{Protocol: ProtocolLongPoll}, fast},
		{"a set interval stays", Config{Liveness: tunnel.Liveness{Interval: time.Second}}, tunnel.Liveness{Interval: time.Second, Timeout: DefaultStandbyPingTimeout}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.Complete()
			if c.Liveness != tc.want {
				t.Fatalf("Liveness = %+v, want %+v", c.Liveness, tc.want)
			}
		})
	}
}

func TestPromotedMeta(t *testing.T) {
	for _, tc := range []struct {
		meta string
		next string
		ok   bool
	}{
		{"@promoted rl-0011aabb", "rl-0011aabb", true},
		{"@promoted", "", true},
		{"@promoted  ", "", true},
		{"@promoted rl-00 11", "", true}, // not one id: no next standby
		{"@promotedx", "", false},
		{"http", "", false},
		{"", "", false},
	} {
		next, ok := tunnel.Promoted(tc.meta)
		if next != tc.next || ok != tc.ok {
			t.Errorf("Promoted(%q) = %q, %v; want %q, %v", tc.meta, next, ok, tc.next, tc.ok)
		}
	}
}

func TestSuggestedMeta(t *testing.T) {
	for _, tc := range []struct {
		meta string
		want tunnel.RelayAddr
		ok   bool
	}{
		{"@standby rl-0011aabb=https://relay-2.example:8443", tunnel.RelayAddr{ID: "rl-0011aabb", URL: "https://relay-2.example:8443"}, true},
		{"@standby rl-1=http://10.0.0.2:8080", tunnel.RelayAddr{ID: "rl-1", URL: "http://10.0.0.2:8080"}, true},
		{"@standby rl-1=https://a,rl-2=https://b", tunnel.RelayAddr{}, false}, // one relay, not a list
		{"@standby rl-1=ftp://a", tunnel.RelayAddr{}, false},
		{"@standby rl-1=https://", tunnel.RelayAddr{}, false},
		{"@standby =https://a", tunnel.RelayAddr{}, false},
		{"@standby rl-1", tunnel.RelayAddr{}, false},
		{"@standby", tunnel.RelayAddr{}, false},
		{"@standbyrl-1=https://a", tunnel.RelayAddr{}, false},
		{"@promoted rl-1", tunnel.RelayAddr{}, false},
		{"http", tunnel.RelayAddr{}, false},
		{"", tunnel.RelayAddr{}, false},
	} {
		got, ok := tunnel.Suggested(tc.meta)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Suggested(%q) = %+v, %v; want %+v, %v", tc.meta, got, ok, tc.want, tc.ok)
		}
	}
}
