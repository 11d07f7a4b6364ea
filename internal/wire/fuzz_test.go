package wire_test

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/switchboard-relay/switchboard/internal/wire"
)

// fuzzLimit is the decoder limit in the fuzz targets; larger inputs must be
// rejected with ErrTooLarge.
const fuzzLimit = 16 << 10

// codec bundles what the fuzz targets need to know about one message type.
type codec[T any] struct {
	name      string
	unmarshal func(b []byte, limit int) (*T, error)
	marshal   func(*T) []byte
	equal     func(a, b *T) bool
	format    func(*T) string
	desc      func(schema) protoreflect.MessageDescriptor
	fromDyn   func(protoreflect.Message) *T
	headers   func(*T) [][]wire.Header // the repeated fields, in field order
	// reference checks an encoding of m for every field the reference
	// implementation dereferences when it reads this message.
	reference func(s schema, b []byte, m *T) error
}

var requestCodec = codec[wire.Request]{
	name:      "HttpRequest",
	unmarshal: wire.UnmarshalRequest,
	marshal:   (*wire.Request).Marshal,
	equal:     equalRequest,
	format:    fmtRequest,
	desc:      func(s schema) protoreflect.MessageDescriptor { return s.request },
	fromDyn:   requestFromDyn,
	headers:   func(r *wire.Request) [][]wire.Header { return [][]wire.Header{r.Header} },
	reference: func(s schema, b []byte, _ *wire.Request) error { return checkRequestForReference(s, b) },
}

var responseCodec = codec[wire.Response]{
	name:      "HttpResponse",
	unmarshal: wire.UnmarshalResponse,
	marshal:   (*wire.Response).Marshal,
	equal:     equalResponse,
	format:    fmtResponse,
	desc:      func(s schema) protoreflect.MessageDescriptor { return s.response },
	fromDyn:   responseFromDyn,
	headers:   func(r *wire.Response) [][]wire.Header { return [][]wire.Header{r.Header, r.Trailer} },
	reference: func(s schema, b []byte, r *wire.Response) error { return checkResponseForReference(s, b, r.HasStatus) },
}

// fuzzSeeds are real encoded messages of both types (each target gets all of
// them: a message of one type is interesting input for the other), written by
// wire's Marshal and by proto.Marshal of dynamicpb messages, plus a few
// hand-made edge cases.
func fuzzSeeds(tb testing.TB) [][]byte {
	s := testSchema(tb)
	var seeds [][]byte
	add := func(b []byte) { seeds = append(seeds, b) }

	add((&wire.Request{
		ID: reqID, Method: "GET", URL: "http://invalid/api/v1/pods?watch=1",
		Header: []wire.Header{{Name: "Accept", Value: "application/json"}, {Name: "Accept", Value: "*/*"}, {Name: "Authorization", Value: "Bearer t"}},
		Host:   "relay.example.com",
	}).Marshal())
	add((&wire.Request{
		ID: reqID, Method: "POST", URL: "http://invalid/upload",
		Header: []wire.Header{{Name: "Content-Type", Value: "application/json"}},
		Body:   []byte(`{"name":"robot-7","labels":{"zone":"a"}}`),
		Host:   "relay.example.com",
	}).Marshal())
	add((&wire.Response{
		ID: reqID, HasStatus: true, StatusCode: 200,
		Header: []wire.Header{{Name: "Content-Type", Value: "text/plain"}, {Name: "Set-Cookie", Value: "a=1"}, {Name: "Set-Cookie", Value: "b=2"}},
		Body:   []byte("first bytes"),
	}).Marshal())
	add((&wire.Response{ID: reqID, Body: []byte("a body chunk in the middle of the stream")}).Marshal())
	add((&wire.Response{
		ID: reqID, EOF: true,
		Trailer:           []wire.Header{{Name: "Grpc-Status", Value: "0"}, {Name: "Grpc-Message", Value: ""}},
		BackendDurationMS: 42,
	}).Marshal())
	add((&wire.Response{ID: reqID, HasStatus: true, StatusCode: -1, EOF: true, BackendDurationMS: -1}).Marshal())

	// proto.Marshal of dynamicpb messages, with fields present but empty.
	req := dynRequest(s, &wire.Request{ID: reqID, Method: "PUT", Header: []wire.Header{{Name: "X", Value: "1"}}, Body: []byte{0, 1, 2}})
	set(req, "host", "")
	resp := dynResponse(s, &wire.Response{ID: reqID, HasStatus: true, Trailer: []wire.Header{{Name: "T", Value: "v"}}})
	set(resp, "eof", false)
	set(resp, "body", []byte{})
	for _, m := range []proto.Message{req, resp} {
		b, err := proto.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		add(b)
	}

	// Unknown fields of every wire type, and a few malformed inputs.
	for _, u := range unknownFields {
		add(enc{}.str(1, "id").raw(u.in...).msg(2, hdr("A", "1")))
	}
	for _, m := range malformed[:4] {
		add(m.build(4))
	}
	add(nil)
	return seeds
}

func FuzzUnmarshalRequest(f *testing.F) {
	for _, b := range fuzzSeeds(f) {
		f.Add(b)
	}
	s := testSchema(f)
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode(t, s, requestCodec, b) })
}

func FuzzUnmarshalResponse(f *testing.F) {
	for _, b := range fuzzSeeds(f) {
		f.Add(b)
	}
	s := testSchema(f)
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode(t, s, responseCodec, b) })
}

// fuzzDecode checks the properties every input must have:
//   - the limit: input above it is ErrTooLarge, whatever it holds;
//   - no panic, and any error wraps ErrMalformed;
//   - agreement with proto.Unmarshal into dynamicpb: what wire accepts, it
//     accepts with the same fields; what wire rejects, it rejects too, unless
//     a known field came with the wrong wire type (which wire rejects on purpose);
//   - semantic round trip: decode(Marshal(m)) == m, and Marshal is a fixed point;
//   - what we would send on: Marshal(m) holds every field the reference
//     implementation dereferences, every header's value among them;
//   - concatenation: cut anywhere, each piece decodes or fails cleanly, and
//     when both pieces decode, the whole is their merge; so is b twice over.
func fuzzDecode[T any](t *testing.T, s schema, c codec[T], b []byte) {
	if len(b) > 0 {
		if m, err := c.unmarshal(b, len(b)-1); !errors.Is(err, wire.ErrTooLarge) || m != nil {
			t.Fatalf("limit %d for %d bytes: got %v, %v; want ErrTooLarge", len(b)-1, len(b), m, err)
		}
	}
	if len(b) > fuzzLimit {
		return
	}

	got, err := c.unmarshal(b, fuzzLimit)
	if err != nil && (!errors.Is(err, wire.ErrMalformed) || got != nil) {
		t.Fatalf("decode: got %v, %v; want nil and an error wrapping ErrMalformed", got, err)
	}
	ref := dynamicpb.NewMessage(c.desc(s))
	refErr := proto.Unmarshal(b, ref)
	switch {
	case err == nil && refErr != nil:
		t.Fatalf("wire accepts %x, which proto.Unmarshal rejects (%v), as %s", b, refErr, c.format(got))
	case err == nil:
		if want := c.fromDyn(ref); !c.equal(got, want) {
			t.Fatalf("%x:\n wire decodes %s\nproto decodes %s", b, c.format(got), c.format(want))
		}
	case refErr == nil && !hasMistypedKnownField(ref):
		t.Fatalf("wire rejects %x (%v), which proto.Unmarshal accepts with no mistyped field", b, err)
	}
	if err != nil {
		return
	}

	// Semantic round trip.
	re := c.marshal(got)
	if err := c.reference(s, re, got); err != nil {
		t.Fatalf("Marshal of %s = %x: %v", c.format(got), re, err)
	}
	again, err := c.unmarshal(re, len(re))
	if err != nil {
		t.Fatalf("decode of re-encoded %s: %v", c.format(got), err)
	}
	if !c.equal(again, got) {
		t.Fatalf("round trip:\n got %s\nwant %s", c.format(again), c.format(got))
	}
	if re2 := c.marshal(again); !bytes.Equal(re2, re) {
		t.Fatalf("Marshal is not a fixed point: %x then %x", re, re2)
	}

	// Concatenation.
	for _, i := range cutPoints(len(b)) {
		checkMerge(t, s, c, b[:i], b[i:], got)
	}
	if 2*len(b) <= fuzzLimit {
		whole, err := c.unmarshal(append(b[:len(b):len(b)], b...), fuzzLimit)
		if err != nil {
			t.Fatalf("b decodes but b||b does not: %v", err)
		}
		checkMerge(t, s, c, b, b, whole)
	}
}

// checkMerge decodes the pieces a and b of a message whose decoding is whole.
// A piece may fail (a cut inside a field), but only with ErrMalformed; when
// both pieces decode, whole must be their protobuf merge: the repeated fields
// concatenated, and every scalar that b holds overriding a's.
func checkMerge[T any](t *testing.T, s schema, c codec[T], a, b []byte, whole *T) {
	ma, errA := c.unmarshal(a, fuzzLimit)
	mb, errB := c.unmarshal(b, fuzzLimit)
	for _, err := range []error{errA, errB} {
		if err != nil && !errors.Is(err, wire.ErrMalformed) {
			t.Fatalf("decode of a piece: %v, want ErrMalformed", err)
		}
	}
	if errA != nil || errB != nil {
		return
	}
	ha, hb, hw := c.headers(ma), c.headers(mb), c.headers(whole)
	for f := range hw {
		if n := len(ha[f]) + len(hb[f]); len(hw[f]) != n {
			t.Fatalf("cut at %d: repeated field %d has %d entries, pieces have %d+%d", len(a), f, len(hw[f]), len(ha[f]), len(hb[f]))
		}
	}
	merged := dynamicpb.NewMessage(c.desc(s))
	if err := proto.Unmarshal(a, merged); err != nil {
		t.Fatalf("proto.Unmarshal of the first piece: %v", err)
	}
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(b, merged); err != nil {
		t.Fatalf("proto.Unmarshal merge of the second piece: %v", err)
	}
	if want := c.fromDyn(merged); !c.equal(whole, want) {
		t.Fatalf("cut at %d:\n whole decodes %s\nmerged pieces %s", len(a), c.format(whole), c.format(want))
	}
}

// cutPoints is every offset of a short input, and a few spread over a long
// one: each cut costs a full decode with both decoders, so a long input of
// tiny fields must not make one execution take seconds.
func cutPoints(n int) []int {
	var out []int
	if n <= 64 {
		for i := 1; i < n; i++ {
			out = append(out, i)
		}
		return out
	}
	return append(out, 1, 2, 3, n/4, n/2, 3*n/4, n-3, n-2, n-1)
}
