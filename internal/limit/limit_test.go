package limit

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a hand-driven clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newLimiter(c *clock, cfg Config) *Limiter {
	cfg.Now = c.Now
	return New(cfg)
}

var ip = netip.MustParseAddr("203.0.113.9")

// refusedFor returns how long addr is refused, 0 when it is allowed.
func refusedFor(l *Limiter, addr netip.Addr) time.Duration {
	wait, ok := l.Allow(addr)
	if ok != (wait == 0) {
		panic(fmt.Sprintf("Allow returned %v, %v", wait, ok))
	}
	return wait
}

func TestFreeFailures(t *testing.T) {
	c := newClock()
	l := newLimiter(c, Config{})
	for i := range DefaultFreeFailures {
		if wait := refusedFor(l, ip); wait != 0 {
			t.Fatalf("refused for %v before failure %d", wait, i+1)
		}
		l.Fail(ip)
		c.Advance(time.Second)
	}
	if wait := refusedFor(l, ip); wait != 0 {
		t.Fatalf("refused for %v after the %d free failures", wait, DefaultFreeFailures)
	}
	l.Fail(ip)
	if wait := refusedFor(l, ip); wait != DefaultBaseDelay {
		t.Fatalf("after one failure past the free ones: refused for %v, want %v", wait, DefaultBaseDelay)
	}
	c.Advance(DefaultBaseDelay / 2)
	if wait := refusedFor(l, ip); wait != DefaultBaseDelay/2 {
		t.Fatalf("half way: refused for %v, want %v", wait, DefaultBaseDelay/2)
	}
	c.Advance(DefaultBaseDelay / 2)
	if wait := refusedFor(l, ip); wait != 0 {
		t.Fatalf("after the window: refused for %v, want allowed", wait)
	}
	if other := netip.MustParseAddr("203.0.113.10"); refusedFor(l, other) != 0 {
		t.Fatal("another address is refused too")
	}
}

func TestFreeFailuresSpreadOut(t *testing.T) {
	c := newClock()
	l := newLimiter(c, Config{})
	// Five failures a minute, for an hour: a person mistyping now and then.
	for i := range 60 * DefaultFreeFailures {
		l.Fail(ip)
		if wait := refusedFor(l, ip); wait != 0 {
			t.Fatalf("failure %d: refused for %v", i+1, wait)
		}
		c.Advance(DefaultWindow/DefaultFreeFailures + time.Millisecond)
	}
}

func TestRefusalWindowDoublesToTheCap(t *testing.T) {
	c := newClock()
	l := newLimiter(c, Config{})
	for range DefaultFreeFailures {
		l.Fail(ip)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300}
	for i, w := range want {
		w *= time.Second
		l.Fail(ip) // right as the last window ended: a client that keeps trying
		wait := refusedFor(l, ip)
		if wait != w {
			t.Fatalf("refusal %d: %v, want %v", i+1, wait, w)
		}
		c.Advance(wait)
	}
}

func TestRefusalDecays(t *testing.T) {
	c := newClock()
	l := newLimiter(c, Config{})
	for range DefaultFreeFailures + 5 { // windows of 1, 2, 4, 8, 16 s
		l.Fail(ip)
		c.Advance(refusedFor(l, ip))
	}
	// Two windows of quiet after the last refusal: the next is 32/4 s.
	c.Advance(2 * DefaultWindow)
	l.Fail(ip)
	if wait := refusedFor(l, ip); wait != 8*time.Second {
		t.Fatalf("after two quiet minutes: refused for %v, want 8s", wait)
	}
	// Quiet for as long as it takes: the free failures are back.
	c.Advance(8*time.Second + 4*DefaultWindow)
	for i := range DefaultFreeFailures {
		l.Fail(ip)
		if wait := refusedFor(l, ip); wait != 0 {
			t.Fatalf("free failure %d after full decay: refused for %v", i+1, wait)
		}
	}
	l.Fail(ip)
	if wait := refusedFor(l, ip); wait != DefaultBaseDelay {
		t.Fatalf("past the free failures again: refused for %v, want %v", wait, DefaultBaseDelay)
	}
}

func TestQuietWhileRefusedDoesNotDecay(t *testing.T) {
	c := newClock()
	l := newLimiter(c, Config{})
	for range DefaultFreeFailures + 10 { // up to the 5 min cap
		l.Fail(ip)
		c.Advance(refusedFor(l, ip))
	}
	// The client waits out each 5 min window and tries once more: the time
	// spent refused must not count as quiet.
	for i := range 3 {
		l.Fail(ip)
		if wait := refusedFor(l, ip); wait != DefaultMaxDelay {
			t.Fatalf("try %d after a full window: refused for %v, want %v", i+1, wait, DefaultMaxDelay)
		}
		c.Advance(DefaultMaxDelay)
	}
}

func TestSucceed(t *testing.T) {
	c := newClock()
	l := newLimiter(c, Config{})
	for range DefaultFreeFailures {
		l.Fail(ip)
	}
	l.Succeed(ip)
	for i := range DefaultFreeFailures {
		l.Fail(ip)
		if wait := refusedFor(l, ip); wait != 0 {
			t.Fatalf("failure %d after a success: refused for %v; the success should forgive the series", i+1, wait)
		}
	}
	if l.Tracked() != 1 {
		t.Fatalf("tracked %d addresses, want 1", l.Tracked())
	}
	l.Fail(ip)
	first := refusedFor(l, ip)
	c.Advance(first)
	l.Succeed(ip) // a penalised address that gets one right keeps its penalty
	l.Fail(ip)
	if wait := refusedFor(l, ip); wait != 2*first {
		t.Fatalf("after a success while penalised: refused for %v, want %v", wait, 2*first)
	}
}

func TestIPv6GroupedBy64(t *testing.T) {
	c := newClock()
	l := newLimiter(c, Config{})
	for i := range DefaultFreeFailures + 1 {
		l.Fail(netip.MustParseAddr(fmt.Sprintf("2001:db8:1:2::%x", i+1)))
	}
	tests := []struct {
		addr    string
		refused bool
	}{
		{"2001:db8:1:2::1", true},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", true},
		{"2001:db8:1:2::1%eth0", true},
		{"2001:db8:1:3::1", false},
		{"2001:db8:1:1:ffff:ffff:ffff:ffff", false},
	}
	for _, tt := range tests {
		if got := refusedFor(l, netip.MustParseAddr(tt.addr)) > 0; got != tt.refused {
			t.Errorf("%s refused: %v, want %v", tt.addr, got, tt.refused)
		}
	}

	// IPv4 is counted per address, mapped or not.
	for range DefaultFreeFailures + 1 {
		l.Fail(netip.MustParseAddr("::ffff:198.51.100.7"))
	}
	if refusedFor(l, netip.MustParseAddr("198.51.100.7")) == 0 {
		t.Error("198.51.100.7 is allowed after its IPv4-mapped form failed")
	}
	if refusedFor(l, netip.MustParseAddr("198.51.100.8")) != 0 {
		t.Error("198.51.100.8 is refused: IPv4 must not be grouped")
	}
}

func TestKey(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"203.0.113.9", "203.0.113.9/32"},
		{"::ffff:203.0.113.9", "203.0.113.9/32"},
		{"2001:db8:aa:bb:1:2:3:4", "2001:db8:aa:bb::/64"},
		{"fe80::1%eth0", "fe80::/64"},
	}
	for _, tt := range tests {
		if got := Key(netip.MustParseAddr(tt.addr)).String(); got != tt.want {
			t.Errorf("Key(%s) = %s, want %s", tt.addr, got, tt.want)
		}
	}
	if Key(netip.Addr{}) != (netip.Prefix{}) {
		t.Error("the invalid address does not map to the zero key")
	}
}

func TestBoundedUnderAFlood(t *testing.T) {
	c := newClock()
	const max = 1000
	l := newLimiter(c, Config{MaxEntries: max})
	attacker := netip.MustParseAddr("192.0.2.1")
	for range DefaultFreeFailures + 3 {
		l.Fail(attacker)
	}
	// A flood of failures from 200 000 addresses, IPv4 and IPv6 /64s.
	for i := range 200_000 {
		var a netip.Addr
		if i%2 == 0 {
			a = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		} else {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 4: byte(i >> 16), 5: byte(i >> 8), 6: byte(i), 15: 1})
		}
		l.Fail(a)
		if n := l.Tracked(); n > max {
			t.Fatalf("after %d addresses: %d tracked, want at most %d", i+1, n, max)
		}
		if i == max/2 && refusedFor(l, attacker) == 0 {
			t.Fatal("the attacker was forgotten while the limiter had room")
		}
	}
	if n := l.Tracked(); n != max {
		t.Fatalf("%d tracked after the flood, want %d (the most recent)", n, max)
	}
	l.mu.Lock()
	if len(l.entries) != l.byAge.Len() {
		t.Errorf("map holds %d entries, age list %d", len(l.entries), l.byAge.Len())
	}
	l.mu.Unlock()

	// Once time has forgiven them, new failures sweep old entries out.
	c.Advance(2 * DefaultWindow)
	for i := range 10 {
		l.Fail(netip.AddrFrom4([4]byte{172, 16, 0, byte(i)}))
	}
	if n := l.Tracked(); n > max-10 {
		t.Errorf("%d tracked after forgiven entries met new failures, want them swept", n)
	}
}

func TestConcurrentUse(t *testing.T) {
	l := New(Config{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				a := netip.AddrFrom4([4]byte{10, 0, byte(g), byte(i % 7)})
				if _, ok := l.Allow(a); ok {
					l.Fail(a)
				}
				if i%11 == 0 {
					l.Succeed(a)
				}
			}
		})
	}
	wg.Wait()
	if n := l.Tracked(); n > 8*7 {
		t.Fatalf("%d tracked, want at most %d", n, 8*7)
	}
}

func TestRefusedError(t *testing.T) {
	c := newClock()
	l := newLimiter(c, Config{BaseDelay: 8 * time.Second})
	for range DefaultFreeFailures + 1 {
		if err := l.Check(ip); err != nil {
			t.Fatalf("refused before the last failure: %v", err)
		}
		l.Fail(ip)
	}
	c.Advance(300 * time.Millisecond) // 7.7 s left: told 8 s
	err := l.Check(ip)
	var re *RefusedError
	if !errors.As(err, &re) || !errors.Is(err, ErrTooManyFailures) {
		t.Fatalf("Check = %v, want a *RefusedError matching ErrTooManyFailures", err)
	}
	if want := "too many failed sign-ins from 203.0.113.9; try again in 8s"; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
	if re.HTTPStatus() != http.StatusTooManyRequests || re.RetryAfterDelay() != 8*time.Second {
		t.Errorf("status %d, retry after %v; want 429, 8s", re.HTTPStatus(), re.RetryAfterDelay())
	}
	rec := httptest.NewRecorder()
	re.WriteHTTP(rec)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "8" || !strings.Contains(rec.Body.String(), "try again in 8s") {
		t.Errorf("WriteHTTP: %d, Retry-After %q, body %q", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	short := &RefusedError{RetryAfter: 10 * time.Millisecond}
	if short.RetryAfterDelay() != time.Second || !strings.Contains(short.Error(), "from your address; try again in 1s") {
		t.Errorf("a short wait with no address: %q, %v", short, short.RetryAfterDelay())
	}
}

func TestClientIP(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	tests := []struct {
		name    string
		remote  string
		xff     []string
		trusted []netip.Prefix
		want    string // "" for the zero Addr
	}{
		{name: "IPv4", remote: "203.0.113.9:5678", want: "203.0.113.9"},
		{name: "IPv6", remote: "[2001:db8::1]:443", want: "2001:db8::1"},
		{name: "IPv4-mapped", remote: "[::ffff:203.0.113.9]:80", want: "203.0.113.9"},
		{name: "not TCP", remote: "@", want: ""},
		{name: "spoofed header, no trusted proxies", remote: "203.0.113.9:1", xff: []string{"198.51.100.1"}, want: "203.0.113.9"},
		{name: "spoofed header from an untrusted peer", remote: "203.0.113.9:1", xff: []string{"198.51.100.1"}, trusted: proxies, want: "203.0.113.9"},
		{name: "trusted proxy", remote: "10.1.2.3:1", xff: []string{"198.51.100.1"}, trusted: proxies, want: "198.51.100.1"},
		{name: "client-written entries before the proxy's", remote: "10.1.2.3:1", xff: []string{"1.1.1.1, 198.51.100.1"}, trusted: proxies, want: "198.51.100.1"},
		{name: "two trusted proxies", remote: "10.1.2.3:1", xff: []string{"1.1.1.1", "198.51.100.1, 10.9.9.9"}, trusted: proxies, want: "198.51.100.1"},
		{name: "IPv6 proxy", remote: "[2001:db8:ffff::7]:1", xff: []string{"2001:db8:5::1"}, trusted: proxies, want: "2001:db8:5::1"},
		{name: "garbage after the client", remote: "10.1.2.3:1", xff: []string{"198.51.100.1, nonsense"}, trusted: proxies, want: "10.1.2.3"},
		{name: "only proxies", remote: "10.1.2.3:1", xff: []string{"10.4.4.4"}, trusted: proxies, want: "10.4.4.4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tt.remote
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got := ClientIP(r, tt.trusted)
			want := netip.Addr{}
			if tt.want != "" {
				want = netip.MustParseAddr(tt.want)
			}
			if got != want {
				t.Errorf("ClientIP = %v, want %v", got, want)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	c := newClock()
	users := newLimiter(c, Config{Scope: "users"})
	admin := newLimiter(c, Config{Scope: "admin"})
	reg := prometheus.NewRegistry()
	users.RegisterMetrics(reg)
	admin.RegisterMetrics(reg) // a second limiter on the same registry
	for range DefaultFreeFailures + 1 {
		users.Fail(ip)
	}
	users.Allow(ip)
	users.Allow(ip)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName() + "{" + m.GetLabel()[0].GetValue() + "}"
			got[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"switchboard_limit_refusals_total{users}":    2,
		"switchboard_limit_penalties_total{users}":   1,
		"switchboard_limit_tracked_addresses{users}": 1,
		"switchboard_limit_refusals_total{admin}":    0,
		"switchboard_limit_tracked_addresses{admin}": 0,
		"switchboard_limit_penalties_total{admin}":   0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}
