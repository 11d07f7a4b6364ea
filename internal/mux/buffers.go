package mux

import "sync"

// Received payloads are kept in chunks taken from pools of a few sizes, so
// that a stream holds memory only while it has unread bytes, and a chunk
// freed by one stream serves the next.
var chunkSizes = [...]int{1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, MaxFrame}

var chunkPools [len(chunkSizes)]sync.Pool

// getChunk returns a buffer of length n (n ≤ MaxFrame), pooled.
func getChunk(n int) []byte {
	for i, size := range chunkSizes {
		if n <= size {
			if p, ok := chunkPools[i].Get().(*[]byte); ok {
				return (*p)[:n]
			}
			return make([]byte, n, size)
		}
	}
	panic("mux: chunk over MaxFrame") // parseHeader bounds every payload
}

// putChunk returns a buffer from getChunk to its pool.
func putChunk(b []byte) {
	for i, size := range chunkSizes {
		if cap(b) == size {
			b = b[:0]
			chunkPools[i].Put(&b)
			return
		}
	}
}

// readBufSize is the size of the buffer a session reads headers and small
// frames into; larger payloads are read straight into their chunk.
const readBufSize = 16 << 10
