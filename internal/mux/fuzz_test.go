package mux

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// FuzzSession feeds a session arbitrary bytes, delivered in pieces whose
// sizes the fuzzer also picks, and checks that it never panics, never
// buffers more on a stream than its credit, and ends when the bytes do.
// The seeds are what a real session writes.
func FuzzSession(f *testing.F) {
	for _, seed := range realFrames(f) {
		f.Add(seed, []byte{1, 7, 200})
	}
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, input, cuts []byte) {
		conn := &fuzzConn{input: input, cuts: cuts, closed: make(chan struct{})}
		s := New(conn, Config{AcceptBacklog: 8})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				st, err := s.Accept()
				if err != nil {
					return
				}
				st.mu.Lock()
				over := st.buffered > InitialWindow
				st.mu.Unlock()
				if over {
					t.Errorf("stream %d buffers over its credit", st.ID())
				}
				st.Reset(CodeCancel)
			}
		}()
		select {
		case <-s.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("session did not end with its input")
		}
		s.Close()
		<-done
	})
}

// realFrames returns the bytes a client session writes for a few
// exchanges: a stream opened with metadata and data, then half-closed;
// one opened and reset; a ping; a goaway.
func realFrames(tb testing.TB) [][]byte {
	c, s := tcpPair(tb)
	defer s.Close()
	client := New(c, Config{Client: true})
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(s)
		got <- b
	}()
	st, _ := client.Open(context.Background(), []byte("service=web"))
	st.Write([]byte("GET / HTTP/1.1\r\nHost: device\r\n\r\n"))
	st.Write(bytes.Repeat([]byte("x"), 70<<10)) // over one frame
	st.CloseWrite()
	st2, _ := client.Open(context.Background(), nil)
	st2.Write([]byte("y"))
	st2.Reset(CodeApplication)
	client.w.control(header{typ: typePing, value: 9}, nil)
	client.GoAway(3)
	client.w.send() // wait until everything before is written
	client.Close()
	all := <-got
	// The whole exchange, and its first frames alone.
	return [][]byte{all, all[:headerLen+len("service=web")+headerLen+20]}
}

// fuzzConn delivers input in pieces sized by cuts, then reports the end of
// the stream; it swallows writes.
type fuzzConn struct {
	input, cuts []byte
	n           int
	closed      chan struct{}
}

func (c *fuzzConn) Read(p []byte) (int, error) {
	if len(c.input) == 0 {
		return 0, io.EOF
	}
	size := len(c.input)
	if len(c.cuts) > 0 {
		size = int(c.cuts[c.n%len(c.cuts)]) + 1
		c.n++
	}
	size = min(size, len(p), len(c.input))
	copy(p, c.input[:size])
	c.input = c.input[size:]
	return size, nil
}

func (c *fuzzConn) Write(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
		return len(p), nil
	}
}

func (c *fuzzConn) Close() error {
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	return nil
}

func (c *fuzzConn) LocalAddr() net.Addr              { return fuzzAddr{} }
func (c *fuzzConn) RemoteAddr() net.Addr             { return fuzzAddr{} }
func (c *fuzzConn) SetDeadline(time.Time) error      { return errors.ErrUnsupported }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return errors.ErrUnsupported }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }

type fuzzAddr struct{}

func (fuzzAddr) Network() string { return "fuzz" }
func (fuzzAddr) String() string  { return "fuzz" }
