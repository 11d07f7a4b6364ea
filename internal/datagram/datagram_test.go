package datagram

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestBoundariesSurvive(t *testing.T) {
	var stream bytes.Buffer
	w := NewWriter(&stream)
	sizes := []int{0, 1, 1200, MaxSize, 7}
	for i, n := range sizes {
		if _, err := w.Write(bytes.Repeat([]byte{byte(i)}, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Write(make([]byte, MaxSize+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized write: %v", err)
	}
	r := NewReader(&stream)
	buf := make([]byte, MaxSize)
	for i, n := range sizes {
		got, err := r.Read(buf)
		if err != nil || got != n || !bytes.Equal(buf[:got], bytes.Repeat([]byte{byte(i)}, n)) {
			t.Fatalf("datagram %d: %d bytes, %v; want %d", i, got, err, n)
		}
	}
	if _, err := r.Read(buf); err != io.EOF {
		t.Fatalf("after the last: %v", err)
	}
}

func TestShortBufferDropsTheRest(t *testing.T) {
	var stream bytes.Buffer
	w := NewWriter(&stream)
	w.Write([]byte("0123456789"))
	w.Write([]byte("next"))
	r := NewReader(&stream)
	buf := make([]byte, 4)
	if n, err := r.Read(buf); n != 4 || !errors.Is(err, io.ErrShortBuffer) || string(buf) != "0123" {
		t.Fatalf("%q, %v", buf[:n], err)
	}
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "next" {
		t.Fatalf("%q, %v", buf[:n], err)
	}
}

func TestCutShort(t *testing.T) {
	for _, in := range [][]byte{{0}, {0, 5, 'a'}, {0xff, 0xff}} {
		_, err := NewReader(bytes.NewReader(in)).Read(make([]byte, MaxSize))
		if err == nil || err == io.EOF {
			t.Errorf("% x: %v", in, err)
		}
	}
}

func FuzzReader(f *testing.F) {
	var seed bytes.Buffer
	w := NewWriter(&seed)
	w.Write([]byte("hello"))
	w.Write(nil)
	f.Add(seed.Bytes(), 16)
	f.Fuzz(func(t *testing.T, in []byte, size int) {
		size = size%2048 + 1
		if size < 0 {
			size = -size
		}
		r := NewReader(bytes.NewReader(in))
		buf := make([]byte, size)
		for range len(in) + 1 {
			n, err := r.Read(buf)
			if n > len(buf) {
				t.Fatal("read past the buffer")
			}
			if err != nil && !errors.Is(err, io.ErrShortBuffer) {
				return
			}
		}
	})
}
