// Package wire encodes and decodes the messages of the http-relay long-poll
// protocol (protobuf, proto2, package cloudrobotics.http_relay.v1alpha1).
//
// It is pure encode/decode: no I/O, no HTTP. Decoding never panics, skips
// unknown fields as protobuf requires, and rejects any message larger than the
// caller's limit before looking at it, so what a hostile peer can make it
// allocate is a bounded multiple of the bytes it sent (about 17× for a
// message of nothing but empty headers, 1× for bodies).
package wire

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"google.golang.org/protobuf/encoding/protowire"
)

// Content types of the protobuf bodies, as the reference implementation sends them.
const (
	ContentTypeRequest  = "application/vnd.google.protobuf;proto=cloudrobotics.http_relay.v1alpha1.HttpRequest"
	ContentTypeResponse = "application/vnd.google.protobuf;proto=cloudrobotics.http_relay.v1alpha1.HttpResponse"
)

// ErrMalformed is wrapped by every decoding error except ErrTooLarge.
var ErrMalformed = errors.New("malformed protobuf message")

// ErrTooLarge is returned when a message exceeds the decoder's size limit.
var ErrTooLarge = errors.New("protobuf message too large")

// Header is one header value; a header with several values is several entries.
type Header struct {
	Name  string
	Value string
}

// Request is the HttpRequest message: one user request handed to an agent.
type Request struct {
	ID     string // "<device>:<32 lowercase hex>"
	Method string
	URL    string // "http://invalid<path>?<rawquery>#<fragment>"
	Header []Header
	Body   []byte // the whole request body
	Host   string // the user's Host header
}

// Response is the HttpResponse message: one chunk of an agent's response.
type Response struct {
	ID string
	// HasStatus tells whether status_code was present: it marks the first chunk.
	HasStatus         bool
	StatusCode        int32
	Header            []Header
	Body              []byte
	EOF               bool
	Trailer           []Header
	BackendDurationMS int64
}

// Field numbers, from the protocol's .proto file.
const (
	fHeaderName  = 1
	fHeaderValue = 2

	fReqID     = 1
	fReqMethod = 2
	fReqURL    = 3
	fReqHeader = 4
	fReqBody   = 5
	fReqHost   = 6

	fRespStatus   = 1
	fRespHeader   = 2
	fRespBody     = 3
	fRespID       = 4
	fRespEOF      = 5
	fRespTrailer  = 6
	fRespDuration = 7
)

// Marshal encodes r. The id, method, url and host fields, and the name and
// value of every header, are always present, empty or not: the reference
// agent dereferences the id, method and url fields and each header's name
// and value without checking them, and the reference relay always writes
// host. The body is left out when empty, as the reference reads it as a
// plain byte slice.
func (r *Request) Marshal() []byte {
	n := len(r.ID) + len(r.Method) + len(r.URL) + len(r.Body) + len(r.Host) + 32
	for _, h := range r.Header {
		n += len(h.Name) + len(h.Value) + 8
	}
	b := make([]byte, 0, n)
	b = appendString(b, fReqID, r.ID)
	b = appendString(b, fReqMethod, r.Method)
	b = appendString(b, fReqURL, r.URL)
	b = appendHeaders(b, fReqHeader, r.Header)
	if len(r.Body) > 0 {
		b = protowire.AppendTag(b, fReqBody, protowire.BytesType)
		b = protowire.AppendBytes(b, r.Body)
	}
	b = appendString(b, fReqHost, r.Host)
	return b
}

// Size returns the length of r's encoding by WriteTo.
func (r *Request) Size() int {
	return len(r.head()) + len(r.Body)
}

// WriteTo writes r's encoding to w without copying the body: the fields
// other than the body first, then the body (protobuf fields may come in any
// order).
func (r *Request) WriteTo(w io.Writer) (int64, error) {
	head := r.head()
	n, err := w.Write(head)
	if err != nil || len(r.Body) == 0 {
		return int64(n), err
	}
	m, err := w.Write(r.Body)
	return int64(n + m), err
}

// head encodes every field of r but the body, then the body's tag and length.
func (r *Request) head() []byte {
	n := len(r.ID) + len(r.Method) + len(r.URL) + len(r.Host) + 40
	for _, h := range r.Header {
		n += len(h.Name) + len(h.Value) + 8
	}
	b := make([]byte, 0, n)
	b = appendString(b, fReqID, r.ID)
	b = appendString(b, fReqMethod, r.Method)
	b = appendString(b, fReqURL, r.URL)
	b = appendHeaders(b, fReqHeader, r.Header)
	b = appendString(b, fReqHost, r.Host)
	if len(r.Body) > 0 {
		b = protowire.AppendTag(b, fReqBody, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(len(r.Body)))
	}
	return b
}

// Marshal encodes r. The id field, and the name and value of every header
// and trailer, are always present, empty or not: the reference relay
// dereferences them without checking them. status_code is present exactly
// when HasStatus is set (the reference relay answers 500 to a first chunk
// without it); eof, body and backend_duration_ms are read through nil-safe
// getters and are left out when zero.
func (r *Response) Marshal() []byte {
	n := len(r.ID) + len(r.Body) + 40
	for _, h := range r.Header {
		n += len(h.Name) + len(h.Value) + 8
	}
	for _, h := range r.Trailer {
		n += len(h.Name) + len(h.Value) + 8
	}
	b := make([]byte, 0, n)
	if r.HasStatus {
		b = protowire.AppendTag(b, fRespStatus, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(r.StatusCode)))
	}
	b = appendHeaders(b, fRespHeader, r.Header)
	if len(r.Body) > 0 {
		b = protowire.AppendTag(b, fRespBody, protowire.BytesType)
		b = protowire.AppendBytes(b, r.Body)
	}
	b = appendString(b, fRespID, r.ID)
	if r.EOF {
		b = protowire.AppendTag(b, fRespEOF, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	b = appendHeaders(b, fRespTrailer, r.Trailer)
	if r.BackendDurationMS != 0 {
		b = protowire.AppendTag(b, fRespDuration, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.BackendDurationMS))
	}
	return b
}

// body returns the body field's bytes, which alias the input: bodies are
// the bulk of the protocol's bytes and are not copied again.
func body(v []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	return v[:len(v):len(v)]
}

// UnmarshalRequest decodes an HttpRequest of at most limit bytes. The
// decoded Body aliases b; every other field is a copy.
func UnmarshalRequest(b []byte, limit int) (*Request, error) {
	if len(b) > limit {
		return nil, fmt.Errorf("decode HttpRequest: %d bytes exceed the %d-byte limit: %w", len(b), limit, ErrTooLarge)
	}
	r := &Request{}
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch num {
		case fReqID:
			return setString(&r.ID, typ, v)
		case fReqMethod:
			return setString(&r.Method, typ, v)
		case fReqURL:
			return setString(&r.URL, typ, v)
		case fReqHeader:
			return addHeader(&r.Header, typ, v)
		case fReqBody:
			if typ != protowire.BytesType {
				return errWireType
			}
			r.Body = body(v)
		case fReqHost:
			return setString(&r.Host, typ, v)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("decode HttpRequest: %w", err)
	}
	return r, nil
}

// UnmarshalResponse decodes an HttpResponse of at most limit bytes. The
// decoded Body aliases b; every other field is a copy.
func UnmarshalResponse(b []byte, limit int) (*Response, error) {
	if len(b) > limit {
		return nil, fmt.Errorf("decode HttpResponse: %d bytes exceed the %d-byte limit: %w", len(b), limit, ErrTooLarge)
	}
	r := &Response{}
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch num {
		case fRespStatus:
			if typ != protowire.VarintType {
				return errWireType
			}
			r.HasStatus, r.StatusCode = true, int32(x)
		case fRespHeader:
			return addHeader(&r.Header, typ, v)
		case fRespBody:
			if typ != protowire.BytesType {
				return errWireType
			}
			r.Body = body(v)
		case fRespID:
			return setString(&r.ID, typ, v)
		case fRespEOF:
			if typ != protowire.VarintType {
				return errWireType
			}
			r.EOF = x != 0
		case fRespTrailer:
			return addHeader(&r.Trailer, typ, v)
		case fRespDuration:
			if typ != protowire.VarintType {
				return errWireType
			}
			r.BackendDurationMS = int64(x)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("decode HttpResponse: %w", err)
	}
	return r, nil
}

// HeadersFromHTTP flattens h into one entry per value.
func HeadersFromHTTP(h http.Header) []Header {
	n := 0
	for _, vv := range h {
		n += len(vv)
	}
	if n == 0 {
		return nil
	}
	out := make([]Header, 0, n)
	for k, vv := range h {
		for _, v := range vv {
			out = append(out, Header{Name: k, Value: v})
		}
	}
	return out
}

// AddToHTTP adds every entry of hs to h.
func AddToHTTP(h http.Header, hs []Header) {
	for _, e := range hs {
		h.Add(e.Name, e.Value)
	}
}

var errWireType = fmt.Errorf("%w: field has the wrong wire type", ErrMalformed)

// walk calls fn for every field of b. For varints x holds the value; for
// length-delimited fields v holds the bytes (aliasing b). Other wire types of
// unknown fields are skipped; of known fields they are reported to fn with v nil.
func walk(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: bad tag: %v", ErrMalformed, protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("%w: field number %d out of range", ErrMalformed, num)
		}
		b = b[n:]
		var (
			v []byte
			x uint64
		)
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %v", ErrMalformed, num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(num, typ, v, x); err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
	}
	return nil
}

func setString(dst *string, typ protowire.Type, v []byte) error {
	if typ != protowire.BytesType {
		return errWireType
	}
	*dst = string(v)
	return nil
}

func addHeader(dst *[]Header, typ protowire.Type, v []byte) error {
	if typ != protowire.BytesType {
		return errWireType
	}
	var h Header
	err := walk(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch num {
		case fHeaderName:
			return setString(&h.Name, typ, v)
		case fHeaderValue:
			return setString(&h.Value, typ, v)
		}
		return nil
	})
	if err != nil {
		return err
	}
	*dst = append(*dst, h)
	return nil
}

// appendString writes a string field even when it is empty: the reference
// implementation's readers dereference the fields they expect without
// checking them (see Marshal), so an empty value must be present, not left
// out as protobuf would allow.
func appendString(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// appendHeaders writes every entry with both its name and its value, empty
// or not.
func appendHeaders(b []byte, num protowire.Number, hs []Header) []byte {
	for _, h := range hs {
		size := protowire.SizeTag(fHeaderName) + protowire.SizeBytes(len(h.Name)) +
			protowire.SizeTag(fHeaderValue) + protowire.SizeBytes(len(h.Value))
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(size))
		b = appendString(b, fHeaderName, h.Name)
		b = appendString(b, fHeaderValue, h.Value)
	}
	return b
}

// Switchboard's additions to the protocol, ignored by agents and relays that
// do not know them.
const (
	// InstanceHeader, on an agent's calls, carries a random id per agent
	// process, so that a relay can tell when that agent is gone and fail its
	// requests at once instead of at the inactivity timeout.
	InstanceHeader = "X-Switchboard-Agent-Instance"
	// BroadcastHeader, on a device's answer to a GET, marks a stream every
	// viewer shares (an agent's --broadcast-path): a relay fetches it once
	// and fans it out, and removes the header before the answer reaches a
	// user. Version 1 and long-poll agents set it; for version 2 agents,
	// which do not parse HTTP, the relay sets it from their announcement.
	BroadcastHeader = "X-Switchboard-Broadcast"
	// AbortTrailer, on an agent's last chunk, says that the backend's response
	// broke off, so that the user sees an error instead of a clean end. A
	// relay never forwards it.
	AbortTrailer = "X-Switchboard-Abort"
	// PollEndHeader, on a poll one relay forwards to another, says that the
	// forwarding relay may end the poll early by ending the poll's request
	// body: the receiving relay then answers 408 unless it has already
	// handed the poll a request, which the forwarding relay still passes on.
	// Cutting the forward instead could drop a request on its way. A relay
	// honours it only on a signed forward.
	PollEndHeader = "X-Switchboard-Poll-Ends-With-Body"
)
