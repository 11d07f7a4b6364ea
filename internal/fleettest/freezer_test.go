package fleettest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// freezer is a TCP proxy in front of a relay that can freeze: while frozen
// it accepts connections and reads what arrives, and passes nothing on in
// either direction, closes included, as a relay stopped with SIGSTOP
// behaves to everyone who reaches it through this address. A relay that
// advertises the freezer's address is frozen for its peers and agents; its
// own connections (to NATS) go on, as a partitioned relay's would.
type freezer struct {
	ln     net.Listener
	target string

	mu     sync.Mutex    // guards the fields below
	thawed chan struct{} // closed while not frozen
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

// newFreezer listens on loopback; Start points it at its relay.
func newFreezer(t *testing.T) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, thawed: make(chan struct{})}
	close(f.thawed)
	t.Cleanup(f.close)
	return f
}

// URL is the address to advertise.
func (f *freezer) URL() string { return "http://" + f.ln.Addr().String() }

// start passes connections on to target from now on.
func (f *freezer) start(target string) {
	f.target = target
	f.wg.Go(f.accept)
}

func (f *freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		if !f.track(c, up) {
			return
		}
		f.wg.Go(func() { f.pipe(up, c) })
		f.wg.Go(func() { f.pipe(c, up) })
	}
}

// track records conns for close; false when the freezer is closed.
func (f *freezer) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	f.conns = append(f.conns, conns...)
	return true
}

// pipe copies src to dst, holding each piece (and the end) while frozen.
func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		f.wait()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
					return
				}
			}
			dst.Close()
			return
		}
	}
}

// wait returns once the freezer is not frozen, or closed.
func (f *freezer) wait() {
	f.mu.Lock()
	ch := f.thawed
	f.mu.Unlock()
	<-ch
}

// freeze stops passing anything on.
func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.thawed:
		f.thawed = make(chan struct{})
	default:
	}
}

// thaw passes everything held, and what comes after it, on again.
func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.thawed:
	default:
		close(f.thawed)
	}
}

func (f *freezer) close() {
	f.ln.Close()
	f.thaw()
	f.mu.Lock()
	f.closed = true
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	f.wg.Wait()
}
