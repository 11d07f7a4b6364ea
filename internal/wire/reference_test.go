package wire_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/txtar"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/switchboard-relay/switchboard/internal/wire"
)

// The reference implementation (googlecloudrobotics/core, proto2 generated
// Go with pointer fields) dereferences some fields of the messages it reads
// without checking them; a message without one of them panics its reader.
// These are the fields it dereferences or requires, read from its code:
//
//   - the reference agent, reading an HttpRequest: id, method, url, and the
//     name and value of every header (host is checked for nil, body is a
//     plain slice);
//   - the reference relay, reading an HttpResponse: id, and the name and
//     value of every header and trailer; and status_code on the first chunk,
//     which it requires (500 without it) rather than dereferences.
//
// checkRequestForReference and checkResponseForReference hold what it
// dereferences; every message we send must pass them.

// errMissingForReference is wrapped by the reference checks' errors.
var errMissingForReference = errors.New("a field the reference implementation dereferences is absent")

// checkRequestForReference decodes b as the reference agent does and reports
// the first field it would dereference that b leaves out.
func checkRequestForReference(s schema, b []byte) error {
	m := dynamicpb.NewMessage(s.request)
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("proto.Unmarshal: %w", err)
	}
	for _, f := range []string{"id", "method", "url"} {
		if !m.Has(fieldOf(m, f)) {
			return fmt.Errorf("%w: HttpRequest.%s", errMissingForReference, f)
		}
	}
	return checkHeadersForReference(m, "header")
}

// checkResponseForReference decodes b as the reference relay does; first
// says whether b is the first chunk of its response.
func checkResponseForReference(s schema, b []byte, first bool) error {
	m := dynamicpb.NewMessage(s.response)
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("proto.Unmarshal: %w", err)
	}
	if !m.Has(fieldOf(m, "id")) {
		return fmt.Errorf("%w: HttpResponse.id", errMissingForReference)
	}
	if first && !m.Has(fieldOf(m, "status_code")) {
		return fmt.Errorf("%w: HttpResponse.status_code of the first chunk", errMissingForReference)
	}
	for _, f := range []string{"header", "trailer"} {
		if err := checkHeadersForReference(m, f); err != nil {
			return err
		}
	}
	return nil
}

func checkHeadersForReference(m protoreflect.Message, field string) error {
	l := m.Get(fieldOf(m, field)).List()
	for i := range l.Len() {
		h := l.Get(i).Message()
		for _, f := range []string{"name", "value"} {
			if !h.Has(fieldOf(h, f)) {
				return fmt.Errorf("%w: %s.%s[%d].%s", errMissingForReference, m.Descriptor().Name(), field, i, f)
			}
		}
	}
	return nil
}

var updateGolden = flag.Bool("update", false, "rewrite testdata/reference.txtar from the current encoder")

// goldenPath holds the encodings of goldenMessages, one hex section each.
const goldenPath = "testdata/reference.txtar"

// goldenMessage is one message of the kinds the relay and the agent send.
type goldenMessage struct {
	name  string
	bytes func() []byte
	check func(s schema, b []byte) error
}

func goldenRequest(name string, r *wire.Request) []goldenMessage {
	check := func(s schema, b []byte) error { return checkRequestForReference(s, b) }
	return []goldenMessage{
		{name + ".request", r.Marshal, check},
		{name + ".request-writeto", func() []byte {
			var buf bytes.Buffer
			r.WriteTo(&buf)
			return buf.Bytes()
		}, check},
	}
}

func goldenResponse(name string, r *wire.Response) goldenMessage {
	return goldenMessage{name + ".response", r.Marshal, func(s schema, b []byte) error {
		return checkResponseForReference(s, b, r.HasStatus)
	}}
}

// goldenMessages are the messages our relay hands agents (as the broker
// builds them: every string field set, the user's headers as they came) and
// the chunks our agent posts (head, middle, last, its own errors).
func goldenMessages() []goldenMessage {
	var out []goldenMessage
	out = append(out, goldenRequest("get", &wire.Request{
		ID: reqID, Method: "GET", URL: "http://invalid/status?verbose=1",
		Header: []wire.Header{{Name: "Accept", Value: "*/*"}, {Name: "User-Agent", Value: "curl/8.5.0"}},
		Host:   "relay.example.com",
	})...)
	out = append(out, goldenRequest("empty-header-value", &wire.Request{
		ID: reqID, Method: "GET", URL: "http://invalid/",
		Header: []wire.Header{{Name: "X-Empty", Value: ""}, {Name: "Accept", Value: "*/*"}},
		Host:   "relay.example.com",
	})...)
	out = append(out, goldenRequest("post", &wire.Request{
		ID: reqID, Method: "POST", URL: "http://invalid/upload",
		Header: []wire.Header{{Name: "Content-Type", Value: "application/octet-stream"}},
		Body:   []byte("payload"),
		Host:   "relay.example.com",
	})...)
	out = append(out, goldenRequest("grpc-empty-stream", &wire.Request{
		ID: reqID, Method: "POST", URL: "http://invalid/grpc.testing.TestService/StreamingInputCall",
		Header: []wire.Header{{Name: "Content-Type", Value: "application/grpc"}, {Name: "Te", Value: "trailers"}, {Name: "Grpc-Accept-Encoding", Value: ""}},
		Host:   "relay.example.com",
	})...)
	out = append(out, goldenRequest("empty-strings", &wire.Request{Header: []wire.Header{{}}})...)
	out = append(out,
		goldenResponse("head", &wire.Response{
			ID: reqID, HasStatus: true, StatusCode: 200,
			Header: []wire.Header{{Name: "Content-Type", Value: "text/plain"}, {Name: "X-Empty", Value: ""}},
		}),
		goldenResponse("whole", &wire.Response{
			ID: reqID, HasStatus: true, StatusCode: 404,
			Header: []wire.Header{{Name: "Content-Length", Value: "9"}}, Body: []byte("not found"),
			EOF: true, BackendDurationMS: 3,
		}),
		goldenResponse("middle", &wire.Response{ID: reqID, Body: []byte("chunk")}),
		goldenResponse("keepalive", &wire.Response{ID: reqID}),
		goldenResponse("last-with-trailers", &wire.Response{
			ID: reqID, EOF: true,
			Trailer:           []wire.Header{{Name: "Grpc-Status", Value: "0"}, {Name: "Grpc-Message", Value: ""}},
			BackendDurationMS: 12,
		}),
		goldenResponse("no-id", &wire.Response{HasStatus: true, StatusCode: 502, EOF: true}),
	)
	return out
}

// TestReferenceGolden pins the bytes of every kind of message we send, and
// checks each against what the reference implementation dereferences. Run
// with -update to rewrite the file after a deliberate change of encoding.
func TestReferenceGolden(t *testing.T) {
	s := testSchema(t)
	msgs := goldenMessages()
	if *updateGolden {
		ar := &txtar.Archive{Comment: []byte("Encodings of the messages Switchboard sends (hex), checked byte for byte by TestReferenceGolden.\nRegenerate with: go test ./internal/wire -run TestReferenceGolden -update\n")}
		for _, m := range msgs {
			ar.Files = append(ar.Files, txtar.File{Name: m.name, Data: []byte(hex.EncodeToString(m.bytes()) + "\n")})
		}
		if err := os.WriteFile(goldenPath, txtar.Format(ar), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ar, err := txtar.ParseFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	golden := map[string][]byte{}
	for _, f := range ar.Files {
		b, err := hex.DecodeString(strings.TrimSpace(string(f.Data)))
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		golden[f.Name] = b
	}
	var names []string
	for _, m := range msgs {
		names = append(names, m.name)
		t.Run(m.name, func(t *testing.T) {
			want, ok := golden[m.name]
			if !ok {
				t.Fatalf("%s has no section %s (run with -update)", goldenPath, m.name)
			}
			if got := m.bytes(); !bytes.Equal(got, want) {
				t.Errorf("encoding changed:\n got %x\nwant %x", got, want)
			}
			if err := m.check(s, want); err != nil {
				t.Errorf("the reference implementation cannot read %x: %v", want, err)
			}
		})
	}
	for name := range golden {
		if !slices.Contains(names, name) {
			t.Errorf("%s has a section %s that no message produces", goldenPath, name)
		}
	}
}
