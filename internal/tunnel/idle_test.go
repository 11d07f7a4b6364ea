package tunnel

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// TestIdleV2SessionHoldsOneGoroutine: an idle version 2 session costs the
// relay at most one goroutine, the session's reader, until it parks; the
// session still leaves the pool when its connection dies.
func TestIdleV2SessionHoldsOneGoroutine(t *testing.T) {
	const n = 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pool := NewPool(Liveness{Interval: time.Hour, Timeout: time.Hour}, nil)
	defer pool.Close()
	services, err := service.ParseAnnouncement(announce(t, service.Service{Name: service.Default, Kind: service.HTTP, Addr: "127.0.0.1:1"}))
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	agents := make([]*mux.Session, 0, n)
	defer func() {
		for _, a := range agents {
			a.Close()
		}
	}()
	for i := range n {
		agentEnd, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, mux.New(agentEnd, mux.Config{Client: true, RefuseStreams: true}))
		relayEnd, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.AddV2(relayEnd, "dev-"+strconv.Itoa(i), "", "", services); err != nil {
			t.Fatal(err)
		}
	}
	// Each pair of ends has at most the agent's reader and the relay's: a
	// session that has carried no stream for a second parks, holding none
	// (on a slow machine the first may have by now).
	if got, want := runtime.NumGoroutine()-before, 2*n; got > want {
		t.Errorf("%d idle sessions started %d goroutines, want at most %d (one reader at each end)", n, got, want)
	}
	for _, a := range agents {
		a.Close()
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		for i := range n {
			if pool.Has("dev-" + strconv.Itoa(i)) {
				return fmt.Errorf("dev-%d is still in the pool after its agent went", i)
			}
		}
		if got := runtime.NumGoroutine() - before; got > 0 {
			return errors.New(strconv.Itoa(got) + " goroutines left")
		}
		return nil
	})
}
