package mux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// streamPair opens a stream on client and accepts it on server.
func streamPair(t testing.TB, client, server *Session) (*Stream, *Stream) {
	t.Helper()
	st, err := client.Open(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte{0}); err != nil { // the OPEN goes out with it
		t.Fatal(err)
	}
	peer := accept(t, server)
	if _, err := io.ReadFull(peer, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	return st, peer
}

// hidden hides a reader's or writer's WriteTo and ReadFrom, as a wrapper
// that embeds an interface does.
type hidden struct{ net.Conn }

// heapPerCopy returns the live heap per copy over base, after the garbage
// collector has emptied the pools.
func heapPerCopy(base uint64, copies int) int64 {
	runtime.GC()
	runtime.GC() // a pool's buffers survive one collection
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return (int64(ms.HeapAlloc) - int64(base)) / int64(copies)
}

func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Idle copies between sockets and streams hold no copy buffer: a stream
// reading from a TCP socket (ReadFrom, here reached through io.Copy and
// net.TCPConn's WriteTo, as splice and net/http reach it), and Copy
// waiting on a stream, or on a WaitingConn, behind a wrapper that hides
// what they are.
func TestIdleCopiesHoldNoBuffer(t *testing.T) {
	const copies = 64
	client, server := tcpSessions(t)
	type joined struct {
		user, back net.Conn // the user's socket, and the service's
		done       chan error
	}
	base := heapNow()
	var js []joined
	for range copies {
		user, front := tcpPair(t)
		back, service := tcpPair(t)
		st, peer := streamPair(t, client, server)
		j := joined{user: user, back: service, done: make(chan error, 4)}
		go func() { _, err := io.Copy(st, front); j.done <- err }()
		go func() { _, err := Copy(front, hidden{st}); j.done <- err }()
		go func() { _, err := Copy(back, peer); j.done <- err }()
		go func() { _, err := Copy(peer, hidden{WaitingConn(back)}); j.done <- err }() // a socket behind a wrapper
		t.Cleanup(func() {
			for _, c := range []net.Conn{user, front, back, service} {
				c.Close()
			}
			st.Close()
			peer.Close()
		})
		js = append(js, j)
	}
	// One round trip each, so that every copy has moved bytes once.
	for i, j := range js {
		msg := fmt.Appendf(nil, "hello %d", i)
		j.user.Write(msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(j.back, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("copy %d to the service: %q, %v", i, got, err)
		}
		j.back.Write(msg)
		if _, err := io.ReadFull(j.user, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("copy %d back to the user: %q, %v", i, got, err)
		}
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		// Four idle copies per pair, their sockets, streams and goroutines: one
		// held buffer would add 16 KiB at least.
		if per := heapPerCopy(base, copies); per > 12<<10 {
			return fmt.Errorf("%d bytes of heap per pair of idle websockets' copies, want under 12 KiB", per)
		}
		return nil
	})
	for _, j := range js {
		j.user.Close()
		j.back.Close()
	}
}

// Everything written to the user's socket reaches the service's through
// ReadFrom, the streams and WriteTo, and back through Copy's other paths,
// in pieces cut anywhere, beyond the streams' windows; half-closes end
// each direction.
func FuzzCopy(f *testing.F) {
	f.Add([]byte("hello"), []byte{1, 2, 3})
	f.Add(bytes.Repeat([]byte("0123456789abcdef"), 40000), []byte{0, 255, 7})
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		if len(data) > 1<<20 {
			return
		}
		c, s := tcpPair(t)
		client, server := sessions(t, c, s, Config{}, Config{})
		user, front := tcpPair(t)
		back, service := tcpPair(t)
		defer func() {
			for _, c := range []net.Conn{user, front, back, service} {
				c.Close()
			}
		}()
		st, err := client.Open(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 4)
		go func() { errs <- halfClosing(front.(*net.TCPConn).WriteTo(st))(st) }() // through TCPConn's fallback to ReadFrom
		go func() { errs <- halfClosing(st.WriteTo(front))(front) }()
		peer := make(chan *Stream, 1)
		go func() {
			p, err := server.Accept()
			if err != nil {
				errs <- err
				close(peer)
				return
			}
			peer <- p
			go func() { errs <- halfClosing(Copy(hidden{back}, p))(back) }() // the empty-read path: a socket behind a wrapper
			errs <- halfClosing(Copy(p, hidden{back}))(p)
		}()
		go func() {
			w := data
			for i := 0; len(w) > 0; i++ {
				n := len(w)
				if len(cuts) > 0 {
					n = min(n, 1+int(cuts[i%len(cuts)])*97)
				}
				user.Write(w[:n])
				w = w[n:]
			}
			user.(*net.TCPConn).CloseWrite()
		}()
		got, err := io.ReadAll(service)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("the service read %d bytes of %d, %v", len(got), len(data), err)
		}
		service.Write(got)
		service.(*net.TCPConn).CloseWrite()
		back2, err := io.ReadAll(user)
		if err != nil || !bytes.Equal(back2, data) {
			t.Fatalf("the user read %d bytes of %d back, %v", len(back2), len(data), err)
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatalf("a copy failed: %v", err)
			}
		}
		if p, ok := <-peer; ok {
			p.Close()
		}
		st.Close()
	})
}

// halfClosing passes a copy's end on to its destination as a half-close.
func halfClosing(_ int64, err error) func(dst any) error {
	return func(dst any) error {
		if err != nil {
			return err
		}
		if h, ok := dst.(hidden); ok {
			dst = h.Conn
		}
		return dst.(interface{ CloseWrite() error }).CloseWrite()
	}
}

// A copy from a socket keeps its read deadline, and a closed stream ends
// ReadFrom with net.ErrClosed.
func TestReadFromDeadlineAndClose(t *testing.T) {
	client, server := tcpSessions(t)
	user, front := tcpPair(t)
	defer user.Close()
	defer front.Close()
	st, peer := streamPair(t, client, server)
	defer peer.Close()
	front.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := st.ReadFrom(front); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadFrom past the deadline: %v", err)
	}
	front.SetReadDeadline(time.Time{})
	st.Close()
	user.Write([]byte("late"))
	if _, err := st.ReadFrom(front); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("ReadFrom into a closed stream: %v", err)
	}
}

// A session that was busy holds, once idle again, neither the map of its
// streams nor the writer's larger arrays.
func TestIdleSessionLetsGoOfABurst(t *testing.T) {
	client, server := tcpSessions(t)
	go echoServer(server)
	var streams []*Stream
	for range 200 {
		st, err := client.Open(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	errs := make(chan error, len(streams))
	for _, st := range streams {
		go func() {
			_, err := st.Write([]byte("burst"))
			errs <- err
		}()
	}
	for range streams {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range streams {
		st.CloseWrite()
		if _, err := io.ReadAll(st); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		client.mu.Lock()
		streams, pings := client.streams, client.pings
		client.mu.Unlock()
		client.w.mu.Lock()
		queue, spare, bufs := cap(client.w.queue), cap(client.w.spare), cap(client.w.bufs)
		client.w.mu.Unlock()
		if streams != nil || pings != nil || queue > keepFrames || spare > keepFrames || bufs > 2*keepFrames {
			return fmt.Errorf("idle session holds streams %v, pings %v, writer arrays of %d, %d and %d", streams, pings, queue, spare, bufs)
		}
		return nil
	})
}

// Copies run by Go wait on small stacks: the goroutine that wrote is gone
// by the time the next wait begins (a Copy's goroutine keeps the stack it
// grew to write, about 4 KiB).
func TestGoWaitsOnSmallStacks(t *testing.T) {
	const pairs = 100
	limit := int64(3 << 10)
	if raceEnabled {
		limit = 6 << 10 // the race detector's stacks are larger
	}
	client, server := tcpSessions(t)
	stacks := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.StackInuse)
	}
	base := stacks()
	var wg sync.WaitGroup
	done := func(int64, error) { wg.Done() }
	var users, services []net.Conn
	var closers []io.Closer
	for range pairs {
		user, front := tcpPair(t)
		back, service := tcpPair(t)
		st, peer := streamPair(t, client, server)
		wg.Add(4)
		Go(st, front, done)
		Go(front, st, done)
		Go(back, peer, done)
		Go(peer, back, done)
		users, services = append(users, user), append(services, service)
		closers = append(closers, front, back, st, peer)
	}
	for i := range users {
		msg := fmt.Appendf(nil, "hello %d", i)
		users[i].Write(msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(services[i], got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("copy %d to the service: %q, %v", i, got, err)
		}
		services[i].Write(msg)
		if _, err := io.ReadFull(users[i], got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("copy %d back to the user: %q, %v", i, got, err)
		}
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if per := (stacks() - base) / (4 * pairs); per > limit {
			return fmt.Errorf("%d bytes of stack per idle copy, want at most %d", per, limit)
		}
		return nil
	})
	for i := range users {
		users[i].Close()
		services[i].Close()
	}
	for _, c := range closers {
		c.Close()
	}
	wg.Wait()
}

// A copy's read buffer starts at 4 KiB, grows while reads fill it, up to
// a frame, and shrinks again when they bring little.
func TestReadSizeFollowsTheReads(t *testing.T) {
	var r readSize
	for i, tt := range []struct{ read, next int }{
		{0, 4 << 10},
		{100, 4 << 10},
		{4 << 10, 16 << 10},
		{16 << 10, 64 << 10},
		{64 << 10, 64 << 10},
		{20 << 10, 64 << 10},
		{100, 16 << 10},
		{100, 4 << 10},
		{100, 4 << 10},
	} {
		if tt.read > 0 || i > 0 {
			r.saw(tt.read)
		}
		if got := r.size(); got != tt.next {
			t.Fatalf("step %d: after a read of %d, size %d, want %d", i, tt.read, got, tt.next)
		}
	}
}

// A WaitingConn's empty read waits for bytes and reads none of them; at
// the socket's end it returns, and the next read finds the end.
func TestWaitingConnReadsNothing(t *testing.T) {
	a, b := tcpPair(t)
	defer a.Close()
	w := WaitingConn(a)
	b.Write([]byte("hello"))
	if n, err := w.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(w, got); err != nil || string(got) != "hello" {
		t.Fatalf("read after the empty one: %q, %v", got, err)
	}
	b.Close()
	if _, err := w.Read(nil); err != nil {
		t.Fatalf("empty read at the end: %v", err)
	}
	if _, err := w.Read(got); err != io.EOF {
		t.Fatalf("read at the end: %v, want io.EOF", err)
	}
}

// readWatch records the size of the read in progress on its conn.
type readWatch struct {
	net.Conn
	inflight atomic.Int64 // -1: none
}

func (r *readWatch) Read(p []byte) (int, error) {
	r.inflight.Store(int64(len(p)))
	defer r.inflight.Store(-1)
	return r.Conn.Read(p)
}

// A Copy from a wrapped WaitingConn waits in an empty read, holding no
// buffer, between bursts.
func TestCopyWaitsInAnEmptyRead(t *testing.T) {
	a, b := tcpPair(t)
	out, in := tcpPair(t)
	defer in.Close()
	src := &readWatch{Conn: WaitingConn(a)}
	src.inflight.Store(-1)
	done := make(chan error, 1)
	go func() { _, err := Copy(out, src); out.Close(); done <- err }()
	b.Write([]byte("hello"))
	got := make([]byte, 5)
	if _, err := io.ReadFull(in, got); err != nil || string(got) != "hello" {
		t.Fatalf("copied %q, %v", got, err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := src.inflight.Load(); n != 0 {
			return fmt.Errorf("the idle copy waits in a read of %d bytes, want an empty one", n)
		}
		return nil
	})
	b.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	a.Close()
}

// goroutineID is the running goroutine's number, from its stack's header.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// TestBusyCopyStaysInItsGoroutine: the step after a short wait runs in the
// goroutine of the step before, the step after a long wait in a fresh
// one; and when maxHot copies already stay, each step runs in a fresh
// goroutine.
func TestBusyCopyStaysInItsGoroutine(t *testing.T) {
	run := func(t *testing.T) []string {
		var ids []string
		done := make(chan struct{})
		c := &stepper{
			step: func() (int, error) {
				ids = append(ids, goroutineID())
				switch len(ids) {
				case 5:
					<-time.After(2 * hotWait) // a long wait, in the bubble's time
				case 10:
					return 0, io.EOF
				}
				return 1, nil
			},
			done: func(n int64, err error) {
				if n != 9 || err != nil {
					t.Errorf("done(%d, %v), want done(9, nil)", n, err)
				}
				close(done)
			},
		}
		go c.run()
		<-done
		return ids
	}
	synctest.Test(t, func(t *testing.T) {
		ids := run(t)
		for i, id := range ids {
			if want := ids[min(i/5*5, 5)]; id != want {
				t.Errorf("step %d ran in goroutine %s, want %s (steps: %v)", i+1, id, want, ids)
			}
		}
		if ids[0] == ids[5] {
			t.Errorf("the step after a long wait ran in the goroutine of the step before (steps: %v)", ids)
		}
		if n := hotCopies.Load(); n != 0 {
			t.Errorf("%d copies hold a place among the hot ones after they ended", n)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		hotCopies.Add(maxHot)
		defer hotCopies.Add(-maxHot)
		ids := run(t)
		seen := map[string]bool{}
		for _, id := range ids {
			if seen[id] {
				t.Errorf("with every place taken, a step ran in the goroutine of another (steps: %v)", ids)
			}
			seen[id] = true
		}
	})
}

// wrapped is a stream under a wrapper that copies whole (WriteTo,
// ReadFrom) and in steps.
type wrapped struct{ st *Stream }

func (w wrapped) Read(p []byte) (int, error)                  { return w.st.Read(p) }
func (w wrapped) Write(p []byte) (int, error)                 { return w.st.Write(p) }
func (w wrapped) WriteTo(dst io.Writer) (int64, error)        { return w.st.WriteTo(dst) }
func (w wrapped) ReadFrom(src io.Reader) (int64, error)       { return w.st.ReadFrom(src) }
func (w wrapped) WriteStep(dst io.Writer) func() (int, error) { return WriteSteps(w.st, dst) }
func (w wrapped) ReadStep(src io.Reader) func() (int, error)  { return ReadSteps(w.st, src) }

// embedding embeds a stream and copies through a WriteTo of its own (one
// that translates errors, say): its copies must go through that.
type embedding struct{ *Stream }

func (e embedding) WriteTo(dst io.Writer) (int64, error) { return e.Stream.WriteTo(dst) }

// whole is a stream under a wrapper that copies only whole.
type whole struct{ st *Stream }

func (w whole) Read(p []byte) (int, error)            { return w.st.Read(p) }
func (w whole) Write(p []byte) (int, error)           { return w.st.Write(p) }
func (w whole) WriteTo(dst io.Writer) (int64, error)  { return w.st.WriteTo(dst) }
func (w whole) ReadFrom(src io.Reader) (int64, error) { return w.st.ReadFrom(src) }

// TestWrappersOfStreamsCopyInSteps: a copy from or to a wrapper that
// offers steps runs them (so that Go waits on small stacks), not the
// wrapper's whole WriteTo or ReadFrom; one that offers none runs whole,
// and so does one that embeds a stream, whose own WriteTo must not be
// passed by.
func TestWrappersOfStreamsCopyInSteps(t *testing.T) {
	client, server := tcpSessions(t)
	st, peer := streamPair(t, client, server)
	defer st.Close()
	defer peer.Close()
	sock, other := tcpPair(t)
	defer sock.Close()
	defer other.Close()
	for _, tc := range []struct {
		name  string
		dst   io.Writer
		src   io.Reader
		steps bool
	}{
		{"from a stepped wrapper", sock, wrapped{st}, true},
		{"to a stepped wrapper", wrapped{st}, sock, true},
		{"from a wrapper without steps", sock, whole{st}, false},
		{"to a wrapper without steps", whole{st}, sock, false},
		{"from a wrapper embedding a stream", sock, embedding{st}, false},
	} {
		step, all := plan(tc.dst, tc.src)
		if got := step != nil && all == nil; got != tc.steps {
			t.Errorf("%s: copies in steps %v, want %v", tc.name, got, tc.steps)
		}
	}
}
