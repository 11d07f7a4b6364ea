package mux

import (
	"bytes"
	"context"
	"io"
	"testing"
)

// TestRawReaderTakesWhatReadsNeed: a session woken by a few bytes (a
// ping) reads them into a 4 KiB buffer, not one of readBufSize, so that
// many idle sessions woken at once take little; a buffer that the bytes
// kept for a frame fill grows, keeping them, and so does one smaller than
// what full reads have come to ask for.
func TestRawReaderTakesWhatReadsNeed(t *testing.T) {
	c, s := tcpPair(t)
	defer c.Close()
	defer s.Close()
	r := newRawReader(s)
	if r == nil {
		t.Fatal("no raw reader for a TCP socket")
	}
	ping := []byte("twelve bytes")
	if _, err := c.Write(ping); err != nil {
		t.Fatal(err)
	}
	buf, n, err := r.read(nil, 0)
	if err != nil || n != len(ping) {
		t.Fatalf("read %d bytes, %v; want %d", n, err, len(ping))
	}
	if cap(buf) > 4<<10 {
		t.Errorf("a %d-byte read took a buffer of %d bytes, want 4 KiB", n, cap(buf))
	}

	// The ping's bytes stay, as those of a frame not yet whole would: the
	// reads after it fill the 4 KiB buffer, and the next must not be one
	// into nothing (which reads as the connection's end).
	rest := bytes.Repeat([]byte("0123456789abcdef"), 1<<10) // 16 KiB
	if _, err := c.Write(rest); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte(nil), ping...), rest...)
	w := n
	for w < len(want) {
		buf, n, err = r.read(buf, w)
		if err != nil {
			t.Fatalf("after %d bytes in a buffer of %d: %v", w, len(buf), err)
		}
		w += n
	}
	if !bytes.Equal(buf[:w], want) {
		t.Fatal("the bytes read across the buffer's growth differ from those written")
	}
	putChunk(buf)

	// Reads that fill the buffer from its start ask for larger ones.
	big := bytes.Repeat([]byte("fedcba9876543210"), 4<<10) // 64 KiB
	if _, err := c.Write(big); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(big) {
		buf, n, err = r.read(nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		putChunk(buf)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("the bytes of full reads differ from those written")
	}
	if size := r.sizes.size(); size <= 4<<10 {
		t.Errorf("after full reads of 64 KiB the reader asks for %d bytes, want more than 4 KiB", size)
	}
}

// TestSessionReadsFramesLargerThanItsBuffer: a session whose reads have
// been small (its buffer 4 KiB) receives whole frames of every size, those
// that wait in the read buffer (under largePayload) and those read into a
// chunk of their own, each arriving intact.
func TestSessionReadsFramesLargerThanItsBuffer(t *testing.T) {
	client, server := tcpSessions(t)
	if _, err := client.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := client.Open(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{1, 4<<10 - headerLen, 4 << 10, 5000, 12000, largePayload - 1, largePayload, 40000, readBufSize, 3 * readBufSize}
	var want []byte
	for i, n := range sizes {
		want = append(want, bytes.Repeat([]byte{byte('a' + i)}, n)...)
	}
	go func() {
		for i, n := range sizes {
			if _, err := st.Write(bytes.Repeat([]byte{byte('a' + i)}, n)); err != nil {
				return
			}
		}
		st.CloseWrite()
	}()
	peer := accept(t, server)
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d; they differ", len(got), len(want))
	}
	st.Close()
	peer.Close()
}
