package fleettest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
)

// roundRobin is a plain TCP load balancer: each connection goes to the next
// backend in turn, with no health checks and no idea of devices.
type roundRobin struct {
	ln       net.Listener
	backends []string
	next     atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

func startRoundRobin(t *testing.T, backends []string) *roundRobin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb := &roundRobin{ln: ln, backends: backends, conns: map[net.Conn]bool{}}
	lb.wg.Go(lb.serve)
	t.Cleanup(lb.close)
	return lb
}

func (lb *roundRobin) URL() string { return "http://" + lb.ln.Addr().String() }

func (lb *roundRobin) serve() {
	for {
		c, err := lb.ln.Accept()
		if err != nil {
			return
		}
		target := lb.backends[int(lb.next.Add(1)-1)%len(lb.backends)]
		lb.wg.Go(func() { lb.pipe(c, target) })
	}
}

func (lb *roundRobin) pipe(c net.Conn, target string) {
	defer c.Close()
	u, _ := url.Parse(target)
	up, err := net.Dial("tcp", u.Host)
	if err != nil {
		return
	}
	defer up.Close()
	lb.mu.Lock()
	lb.conns[c], lb.conns[up] = true, true
	lb.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(c, up); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

func (lb *roundRobin) close() {
	lb.ln.Close()
	lb.mu.Lock()
	for c := range lb.conns {
		c.Close()
	}
	lb.mu.Unlock()
	lb.wg.Wait()
}

// TestBehindRoundRobinBalancer puts a plain round-robin balancer in front of
// three relays: agents of both protocols and users reach the fleet only
// through it, and every request finds its device.
func TestBehindRoundRobinBalancer(t *testing.T) {
	relays := StartFleet(t, 3)
	var urls []string
	for _, r := range relays {
		urls = append(urls, r.URL)
	}
	lb := startRoundRobin(t, urls)
	b := newBackend(t, "b")
	tok := FleetToken(t, relays, auth.KindAgent, "", "lb-*")
	user := FleetToken(t, relays, auth.KindUser, "u", "lb-*")
	devices := []string{"lb-native-1", "lb-native-2", "lb-poll-1", "lb-poll-2"}
	for _, d := range devices {
		proto := agent.ProtocolNative
		if strings.Contains(d, "poll") {
			proto = agent.ProtocolLongPoll
		}
		StartAgent(t, &Relay{URL: lb.URL()}, d, b.URL, tok, protocol(proto))
	}
	c := NewClient(t, false) // a new connection, so a new relay, per request
	for _, d := range devices {
		Eventually(t, 10*time.Second, func() error {
			resp := do(t, http.MethodGet, lb.URL()+"/client/"+d+"/echo/first", user, nil)
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", d, resp.Status)
			}
			return nil
		})
	}
	for i := range 24 {
		d := devices[i%len(devices)]
		req, _ := http.NewRequest(http.MethodPost, lb.URL()+"/client/"+d+"/echo/rr", strings.NewReader(fmt.Sprint(i)))
		req.Header.Set("Authorization", "Bearer "+user)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("request %d for %s: %v", i, d, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), fmt.Sprintf(`"Body":"%d"`, i)) {
			t.Fatalf("request %d for %s through the balancer: %s %s", i, d, resp.Status, body)
		}
	}
	// Each device sits on one relay, whichever relay its agents reached first.
	for _, d := range devices {
		e, err := relays[0].Node.Fleet().Device(d)
		if err != nil || e.Agents == 0 {
			t.Errorf("%s: %+v, %v", d, e, err)
		}
	}
}
