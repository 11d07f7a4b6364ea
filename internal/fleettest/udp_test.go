package fleettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/datagram"
	"github.com/switchboard-relay/switchboard/internal/flows"
)

// udpEchoService serves a UDP echo on loopback until the test ends,
// answering each datagram upper-cased.
func udpEchoService(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	go func() {
		defer close(done)
		buf := make([]byte, datagram.MaxSize)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(bytes.ToUpper(buf[:n]), addr)
		}
	}()
	return pc.LocalAddr().String()
}

// udpExchange sends msg from c and returns the first datagram back.
func udpExchange(c net.Conn, msg string) (string, error) {
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, datagram.MaxSize)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// TestUDPPortThroughFleet: a UDP port mapped by ctl answers on both
// relays of a fleet with the device's UDP echo, through the relay holding
// the device and one hop to it; each source is one flow, datagrams keep
// their boundaries.
func TestUDPPortThroughFleet(t *testing.T) {
	relays, hosts := portFleet(t)
	holder, _ := HolderFor(t, relays, "robot")
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "voice=udp://"+udpEchoService(t)))
	holder.WaitDevice(t, "robot")

	probe, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(probe.LocalAddr().(*net.UDPAddr).Port)
	probe.Close()
	mustCtl(t, relays[0], "ports", "add", port, "robot/voice", "--udp")
	for i, host := range hosts {
		c, err := net.Dial("udp", net.JoinHostPort(host, port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		Eventually(t, 10*time.Second, func() error { // until the relay has the mapping
			got, err := udpExchange(c, "hello relay "+strconv.Itoa(i))
			if err == nil && got != "HELLO RELAY "+strconv.Itoa(i) {
				err = fmt.Errorf("%s answered %q", host, got)
			}
			return err
		})
		for _, msg := range []string{"", string(make([]byte, 1400)), "three"} {
			if got, err := udpExchange(c, msg); err != nil || got != string(bytes.ToUpper([]byte(msg))) {
				t.Fatalf("through %s, %.10q: %.10q, %v", host, msg, got, err)
			}
		}
	}
}

// connectUDP carries a local UDP socket to target through relay r as
// 'switchboard connect --udp --listen' does, and returns its address.
func connectUDP(t *testing.T, r *Relay, token string, target connect.Target) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := connectClient(t, r, token)
	target.Network = connect.UDP
	srv := &flows.Server{Conn: pc, Open: func(ctx context.Context, _ netip.AddrPort) (net.Conn, error) {
		return c.Dial(ctx, target)
	}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(ctx) })
	t.Cleanup(func() {
		cancel()
		pc.Close()
		wg.Wait()
	})
	return pc.LocalAddr().String()
}

// TestConnectUDPThroughFleet: switchboard connect's UDP flows reach the
// device's UDP echo through either relay; a udp service the device lacks,
// and a tcp service asked for as udp, are refused as unknown.
func TestConnectUDPThroughFleet(t *testing.T) {
	relays := StartFleet(t, 2)
	holder, others := HolderFor(t, relays, "robot")
	agentTok := FleetToken(t, relays, auth.KindAgent, "robot-agent", "robot")
	StartAgent(t, holder, "robot", "http://127.0.0.1:1", agentTok, withServices(t, "voice=udp://"+udpEchoService(t), "echo=tcp://"+echoService(t)))
	holder.WaitDevice(t, "robot")
	userTok := FleetToken(t, relays, auth.KindUser, "alice", "robot")

	for name, r := range map[string]*Relay{"holder": holder, "other": others[0]} {
		addr := connectUDP(t, r, userTok, connect.Target{Device: "robot", Service: "voice"})
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, msg := range []string{"hello " + name, string(make([]byte, 8000)), "bye"} {
			if got, err := udpExchange(c, msg); err != nil || got != string(bytes.ToUpper([]byte(msg))) {
				t.Fatalf("through the %s, %.10q: %.10q, %v", name, msg, got, err)
			}
		}

		cl := connectClient(t, r, userTok)
		for _, svc := range []string{"nope", "echo"} {
			st, err := cl.Dial(t.Context(), connect.Target{Device: "robot", Service: svc, Network: connect.UDP})
			if err != nil {
				t.Fatal(err)
			}
			datagram.NewWriter(st).Write([]byte("x"))
			st.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = st.Read(make([]byte, 16))
			st.Close()
			if !errors.Is(err, connect.ErrUnknownService) {
				t.Errorf("through the %s, udp service %s: %v, want ErrUnknownService", name, svc, err)
			}
		}
	}
}
