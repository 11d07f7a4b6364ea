package auth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/store"
)

// natsProxy is a TCP proxy in front of a NATS server that a test can cut
// (close every connection and refuse new ones) or hold (stop passing the
// client's bytes on, keeping them, as a stalled network does).
type natsProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex // guards the fields below
	conns []net.Conn
	cut   bool
	open  chan struct{} // closed while the client's bytes pass
}

func startProxy(t *testing.T, target string) *natsProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &natsProxy{ln: ln, target: target, open: make(chan struct{})}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.closeConns()
		p.release()
		p.wg.Wait()
	})
	return p
}

func (p *natsProxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *natsProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refused := p.cut
		p.mu.Unlock()
		up, err := net.Dial("tcp", p.target)
		if refused || err != nil {
			c.Close()
			if up != nil {
				up.Close()
			}
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, c, true)
		go p.pipe(c, up, false)
	}
}

// pipe copies from src to dst; the client's side waits while held.
func (p *natsProxy) pipe(dst, src net.Conn, fromClient bool) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && fromClient {
			p.mu.Lock()
			open := p.open
			p.mu.Unlock()
			<-open
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *natsProxy) closeConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// setCut cuts every connection and refuses new ones, or lets them in again.
func (p *natsProxy) setCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.mu.Unlock()
	if cut {
		p.closeConns()
	}
}

// hold stops passing the client's bytes on; release sends them.
func (p *natsProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = make(chan struct{})
}

func (p *natsProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// outage is a token store whose NATS connection goes through a proxy, and
// a second token store on the NATS server itself, to see what the bucket
// holds.
type outage struct {
	proxy   *natsProxy
	st      *store.Store // the proxied connection
	tokens  *Store       // on st
	witness *Store       // on the server directly
}

func newOutage(t *testing.T) *outage {
	t.Helper()
	server := openNATS(t, store.Config{Listen: "127.0.0.1:0"})
	o := &outage{proxy: startProxy(t, server.ClientURL()[len("nats://"):])}
	o.st = openNATS(t, store.Config{URLs: []string{o.proxy.URL()}})
	o.tokens = openTokens(t, o.st)
	o.witness = openTokens(t, server)
	return o
}

// settle creates a token through the proxied connection once NATS is
// back, so that whatever the connection sent before has reached the
// server, then waits until the bucket holds exactly want and that token,
// as seen by both stores.
func (o *outage) settle(t *testing.T, want ...string) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		if !o.st.Connected() {
			return errors.New("not reconnected to NATS yet")
		}
		return nil
	})
	_, barrier := mustCreate(t, o.tokens, CreateRequest{Kind: KindUser, Name: "after the outage"})
	want = append(want, barrier.ID)
	slices.Sort(want)
	eventually(t, 10*time.Second, func() error {
		for name, s := range map[string]*Store{"the proxied relay": o.tokens, "the witness": o.witness} {
			toks, _ := s.List(context.Background())
			var ids []string
			for _, tok := range toks {
				ids = append(ids, tok.ID)
			}
			slices.Sort(ids)
			if !slices.Equal(ids, want) {
				return fmt.Errorf("%s lists tokens %v, want %v", name, ids, want)
			}
		}
		return nil
	})
}

// TestCreateWhileNATSIsDownLeavesNoToken: a create while the connection
// to NATS is down fails at once, and no token appears once NATS returns
// (the reconnect buffer used to send the write then).
func TestCreateWhileNATSIsDownLeavesNoToken(t *testing.T) {
	t.Parallel()
	o := newOutage(t)
	o.proxy.setCut(true)
	eventually(t, 5*time.Second, func() error {
		if o.st.Connected() {
			return errors.New("still connected")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := o.tokens.Create(ctx, CreateRequest{Kind: KindUser, Name: "during the outage"})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Create while NATS is down: %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Create while NATS is down took %v; it should fail at once", took)
	}
	o.proxy.setCut(false)
	o.settle(t)
}

// TestCreateWhoseAnswerIsLostLeavesNoToken: a create whose write reaches
// NATS only after the caller gave up (the network held it) is undone: the
// caller was told there is no token, and there is none.
func TestCreateWhoseAnswerIsLostLeavesNoToken(t *testing.T) {
	o := newOutage(t)
	_, kept := mustCreate(t, o.tokens, CreateRequest{Kind: KindUser, Name: "before"})
	o.proxy.hold()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, _, err := o.tokens.Create(ctx, CreateRequest{Kind: KindUser, Name: "held"}); err == nil {
		t.Fatal("Create succeeded while the network held its write")
	}
	if toks, _ := o.tokens.List(context.Background()); len(toks) != 1 {
		t.Errorf("the relay lists %d tokens after the failed create, want 1", len(toks))
	}
	o.proxy.release()
	o.settle(t, kept.ID)
}
