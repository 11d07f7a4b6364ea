package node

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/switchboard-relay/switchboard/internal/fleet"
	"github.com/switchboard-relay/switchboard/internal/ports"
	"github.com/switchboard-relay/switchboard/internal/tcpconns"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// EventPortsFailed is recorded when this relay cannot open mapped ports
// (in use on its host, say): the others stay open.
const EventPortsFailed = "ports.failed"

// openPorts opens the fleet's port mappings.
func (n *Node) openPorts(ctx context.Context) error {
	kv, err := n.store.KeyValue(ctx, ports.Bucket)
	if err != nil {
		return fmt.Errorf("open port bucket: %w", err)
	}
	if n.ports, err = ports.OpenStore(ctx, kv, n.log); err != nil {
		return err
	}
	n.store.OnReconnect(n.ports.Resync)
	return nil
}

// listenPorts listens on each mapped port, on the public listener's host,
// from now on, carrying each connection as switchboard connect does: to
// an agent here, or one hop to the relay holding the device.
func (n *Node) listenPorts() {
	host, _, _ := net.SplitHostPort(n.cfg.Listen)
	n.portListeners = &ports.Listeners{Host: host, Open: openerFunc(n.connect.openAnywhere), Conns: n.conns, Logger: n.log}
	n.ports.OnChange(n.applyPorts)
	n.applyPorts()
}

// applyPorts opens and closes this relay's ports as the mappings say, and
// tells of the ports it could not open, once per different failure.
func (n *Node) applyPorts() {
	err := n.portListeners.Apply(n.ports.List())
	n.portsMu.Lock()
	defer n.portsMu.Unlock()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == n.portsFailed {
		return
	}
	n.portsFailed = msg
	if err == nil {
		return
	}
	n.log.Warn("mapped ports not open on this relay", logkey.Err, err)
	if n.member != nil {
		n.member.Record(fleet.Event{Type: EventPortsFailed, RelayID: n.relayID, Message: fmt.Sprintf("relay %s could not open mapped ports: %v", n.relayID, err)})
	}
}

// ownPorts returns the ports of this relay's own listeners, which no
// mapping may take.
func (n *Node) ownPorts() []int {
	var out []int
	for _, ln := range []net.Listener{n.publicLn, n.adminLn} {
		if ln == nil {
			continue
		}
		if _, p, err := net.SplitHostPort(ln.Addr().String()); err == nil {
			if port, err := strconv.Atoi(p); err == nil {
				out = append(out, port)
			}
		}
	}
	return out
}

// closePorts stops mirroring the mappings, then closes the mapped ports:
// in that order, so that no change opens them again.
func (n *Node) closePorts() {
	if n.ports != nil {
		n.ports.Close()
	}
	if n.portListeners != nil {
		n.portListeners.Close()
	}
}

// drainTCP waits, until ctx ends, for the TCP connections carried here
// (connect's streams and mapped ports' connections) to end; at ctx's end
// it cuts those left and says so, in the log and the fleet's event log.
func (n *Node) drainTCP(ctx context.Context) error {
	err := n.conns.Wait(ctx)
	if err == nil {
		return nil
	}
	cut := n.conns.Cut()
	n.cutTCPNow() // connect's sessions end with their streams
	if cut == 0 {
		return nil
	}
	n.log.Warn("drain deadline passed; cutting TCP connections", logkey.Cut, cut)
	if n.member != nil {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = n.member.RecordNow(rctx, fleet.Event{Type: tcpconns.EventCut, RelayID: n.relayID,
			Message: fmt.Sprintf("relay %s cut %d TCP connections at its drain deadline", n.relayID, cut)})
	}
	return fmt.Errorf("%d TCP connections cut: %w", cut, err)
}

// recordTCP records a TCP connection's event in the fleet's event log.
func (n *Node) recordTCP(e tcpconns.Event) {
	if n.member != nil {
		n.member.Record(fleet.Event{Type: e.Type, RelayID: n.relayID, Device: e.Device, Message: e.Message, DurationMS: e.DurationMS})
	}
}

// portConns counts the TCP connections open through each mapped port here.
func (n *Node) portConns() map[int]int {
	out := map[int]int{}
	for name, c := range n.conns.OpenBy(tcpconns.Port) {
		if port, err := strconv.Atoi(name); err == nil {
			out[port] = c
		}
	}
	return out
}
