package livenesstest

import (
	"context"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// countingConn counts the bytes written to it.
type countingConn struct {
	net.Conn
	wrote atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.wrote.Add(int64(n))
	return n, err
}

// TestPacedSessionCostsOnePingPerAgentInterval: an agent that keeps a
// standby pings every 10 s and announces it; the relay, whose own interval
// is 400 ms, then never pings the idle tunnel itself and keeps it: over a
// minute of silence it writes only the answers to the agent's six pings.
// A session added without the announcement is pinged every 800 ms.
func TestPacedSessionCostsOnePingPerAgentInterval(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		runInChild(t)
		return
	}
	synctest.Test(t, func(t *testing.T) {
		relayLive := tunnel.Liveness{}.WithDefaults()
		agentLive := tunnel.Liveness{Interval: 10 * time.Second, Timeout: 5 * time.Second}
		for _, paced := range []bool{true, false} {
			ctx, cancel := context.WithCancel(context.Background())
			relayEnd, agentEnd := net.Pipe()
			counted := &countingConn{Conn: relayEnd}
			served := make(chan struct{})
			go func() {
				defer close(served)
				tunnel.ServeStreams(ctx, agentEnd, agentLive, func(context.Context, string) (net.Conn, error) { return nil, service.ErrUnknown })
			}()
			pool := tunnel.NewPool(relayLive, nil)
			services := map[string]service.Announced{service.Default: {Name: service.Default, Kind: service.HTTP}}
			var s *tunnel.Session
			var err error
			if paced {
				s, err = pool.AddV2Paced(counted, "dev", "", "inst", services, agentLive.Interval)
			} else {
				s, err = pool.AddV2(counted, "dev", "", "inst", services)
			}
			if err != nil {
				t.Fatal(err)
			}
			<-time.After(time.Minute) // a minute of the bubble's virtual time, the agent silent
			synctest.Wait()
			select {
			case <-s.Done():
				t.Fatalf("paced %v: the relay gave the idle agent up", paced)
			default:
			}
			wrote := counted.wrote.Load()
			t.Logf("paced %v: the relay wrote %d bytes in a minute of silence", paced, wrote)
			const frame = 10 // a ping's or an answer's header
			if paced && wrote > 6*frame {
				t.Errorf("the relay wrote %d bytes to a paced idle agent in a minute, want at most its six answers (%d)", wrote, 6*frame)
			}
			if !paced && wrote <= 6*frame {
				t.Errorf("an unpaced session was pinged no more than a paced one (%d bytes)", wrote)
			}
			cancel()
			<-served
			pool.Close()
		}
	})
}

// TestAloneTunnelIsWatchedQuickly: an agent that pings every 10 s but has
// no standby beside its tunnel (Fast says so) still gives a frozen relay up
// within the quick interval and timeout; with a standby beside it, it
// waits its own 15 s.
func TestAloneTunnelIsWatchedQuickly(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		runInChild(t)
		return
	}
	synctest.Test(t, func(t *testing.T) {
		slow := tunnel.Liveness{Interval: 10 * time.Second, Timeout: 5 * time.Second}
		quick := tunnel.Liveness{}.WithDefaults()
		for _, alone := range []bool{true, false} {
			ctx, cancel := context.WithCancel(context.Background())
			relayEnd, agentEnd := net.Pipe()
			rf, af := newFreezable(relayEnd), newFreezable(agentEnd)
			served := make(chan struct{})
			go func() {
				defer close(served)
				tunnel.ServeStreamsWith(ctx, af, slow, func(context.Context, string) (net.Conn, error) { return nil, service.ErrUnknown },
					tunnel.StreamOptions{Fast: func() bool { return alone }, Quick: quick})
			}()
			pool := tunnel.NewPool(quick, nil)
			if _, err := pool.AddV2Paced(rf, "dev", "", "inst", map[string]service.Announced{service.Default: {Name: service.Default, Kind: service.HTTP}}, slow.Interval); err != nil {
				t.Fatal(err)
			}
			rf.freeze()
			go drain(af.Conn)
			start := time.Now()
			<-served
			took := time.Since(start)
			t.Logf("alone %v: a frozen relay given up after %v (virtual time)", alone, took)
			limit := slow.Interval + slow.Timeout
			if alone {
				// The next ping starts within an interval, and goes
				// unanswered for the interval and the timeout.
				limit = 2*quick.Interval + quick.Timeout
			}
			if took > limit {
				t.Errorf("alone %v: a frozen relay was given up after %v, want ≤ %v", alone, took, limit)
			}
			if !alone && took < slow.Interval {
				t.Errorf("with a standby the agent gave the relay up after %v, before its own interval", took)
			}
			cancel()
			rf.Close()
			pool.Close()
		}
	})
}
