package wire_test

import (
	"testing"

	"github.com/switchboard-relay/switchboard/internal/wire"
)

// bodyChunk is a middle chunk of a streamed response carrying 1 MiB of body.
func bodyChunk() *wire.Response {
	body := make([]byte, 1<<20)
	for i := range body {
		body[i] = byte(i * 7)
	}
	return &wire.Response{ID: reqID, Body: body}
}

func BenchmarkMarshalResponse(b *testing.B) {
	r := bodyChunk()
	b.ReportAllocs()
	b.SetBytes(int64(len(r.Body)))
	for b.Loop() {
		r.Marshal()
	}
}

func BenchmarkUnmarshalResponse(b *testing.B) {
	in := bodyChunk().Marshal()
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := wire.UnmarshalResponse(in, len(in)); err != nil {
			b.Fatal(err)
		}
	}
}
