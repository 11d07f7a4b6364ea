package mux

import (
	"io"
	"net"
)

// Copies between a stream and what it is joined with (a user's socket, a
// service's connection) hold no buffer while nothing moves: WriteTo hands
// over the chunks the stream received, and ReadFrom waits for its source
// to become readable before it takes a pooled buffer, which it gives back
// once the bytes are written. An idle websocket or TCP connection joined
// to a stream so costs its goroutines' stacks and no copy buffers.

// Sizes of the pooled buffers a copy reads into.
const (
	// copyChunk is read from a socket once it is readable: one DATA frame.
	copyChunk = DefaultWriteFrame
	// heldChunk is read from a source that cannot say when it has bytes
	// (a TLS connection), and so is held while the copy waits: 16 KiB,
	// the most one TLS record carries.
	heldChunk = 16 << 10
)

// WriteTo writes what the peer writes to w until the peer's CloseWrite,
// handing over received chunks without a copy of its own; while the
// stream is idle it holds no buffer. Received bytes are credited to the
// peer when they are taken, so a stream holds at most twice its window:
// what it has received and what it is writing to w.
func (st *Stream) WriteTo(w io.Writer) (int64, error) {
	if err := st.flushOpen(); err != nil {
		return 0, err
	}
	var total int64
	var spare net.Buffers // reused between writes; WriteTo consumes what it is given
	for {
		chunks, roff, n, err := st.takeChunks()
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return total, err
		}
		bufs := append(spare[:0], chunks...)
		spare = bufs
		bufs[0] = bufs[0][roff:]
		_, err = bufs.WriteTo(w)
		for _, c := range chunks {
			putChunk(c)
		}
		if err != nil {
			return total, err
		}
		total += int64(n)
	}
}

// takeChunks waits for received bytes and takes them all, crediting the
// peer: the chunks, where the first's unread bytes begin, and how many
// bytes they hold.
func (st *Stream) takeChunks() ([][]byte, int, int, error) {
	st.mu.Lock()
	if err := st.waitReadableLocked(); err != nil {
		st.mu.Unlock()
		return nil, 0, 0, err
	}
	chunks, roff, n := st.chunks, st.roff, st.buffered
	st.chunks, st.roff, st.buffered = nil, 0, 0
	inc := st.consumedLocked(n)
	st.mu.Unlock()
	st.grant(inc)
	return chunks, roff, n, nil
}

// ReadFrom writes what r reads to the stream until r's end (io.EOF),
// waiting for credit as the peer reads; it does not end the stream's
// writing (that is CloseWrite's). When r is a socket — a syscall.Conn,
// such as a *net.TCPConn or the wrapper that net.TCPConn's WriteTo hands
// to io.Copy — it waits for r to become readable holding no buffer, and
// takes a pooled one only to move bytes. Otherwise see Copy.
func (st *Stream) ReadFrom(r io.Reader) (int64, error) { return copyIdle(st, r) }

// Copy copies src to dst until src ends, as io.Copy does, holding no copy
// buffer while src is idle wherever it can tell when src has bytes:
//   - src is a stream, or anything else with a WriteTo other than a
//     kernel socket's (whose WriteTo copies through a 32 KiB buffer when it
//     cannot splice): src.WriteTo(dst);
//   - dst is a stream, or has a ReadFrom other than a kernel socket's:
//     dst.ReadFrom(src);
//   - both are kernel sockets: io.Copy, which splices in the kernel;
//   - src is a socket (a syscall.Conn): it waits for src to become
//     readable holding no buffer, as ReadFrom does;
//   - otherwise each read is preceded by an empty one, which waits for
//     bytes on readers that wait for empty reads (streams, and wrappers
//     that pass reads on: an HTTP/2 body, an upgraded HTTP/1 connection's
//     body once its read buffer is drained); other readers return at
//     once, and the copy then waits holding a 16 KiB buffer.
func Copy(dst io.Writer, src io.Reader) (int64, error) {
	srcSocket, dstSocket := kernelSocket(src), kernelSocket(dst)
	if wt, ok := src.(io.WriterTo); ok && !srcSocket {
		return wt.WriteTo(dst)
	}
	if rf, ok := dst.(io.ReaderFrom); ok && !dstSocket {
		return rf.ReadFrom(src)
	}
	if srcSocket && dstSocket {
		return io.Copy(dst, src)
	}
	return copyIdle(dst, src)
}

// kernelSocket reports whether c is one of the net package's sockets,
// whose WriteTo and ReadFrom move bytes in the kernel when the other side
// is a socket too, and through a buffer of their own otherwise.
func kernelSocket(c any) bool {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}

// copyIdle copies src to dst, waiting for src's bytes holding no buffer
// where it can (see Copy).
func copyIdle(dst io.Writer, src io.Reader) (int64, error) {
	if s := newIdleSocket(src, copyChunk); s != nil {
		return copyFrom(dst, s.read)
	}
	return copyFrom(dst, func() ([]byte, int, error) {
		if _, err := src.Read(nil); err != nil {
			return nil, 0, err
		}
		buf := getChunk(heldChunk)
		n, err := src.Read(buf)
		return buf, n, err
	})
}

// copyFrom writes to dst what read returns until it fails; read returns a
// pooled buffer (or nil) and the bytes in it, and io.EOF at the end.
func copyFrom(dst io.Writer, read func() ([]byte, int, error)) (int64, error) {
	var total int64
	for {
		buf, n, err := read()
		if n > 0 {
			k, werr := dst.Write(buf[:n])
			total += int64(k)
			if werr == nil && k < n {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				putChunk(buf)
				return total, werr
			}
		}
		if buf != nil {
			putChunk(buf)
		}
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return total, err
		}
	}
}
