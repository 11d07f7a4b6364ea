package mux

import (
	"encoding/binary"
	"fmt"
)

// The frame layout: a 10-byte header, then the payload that DATA and OPEN
// frames carry.
//
//	type   uint8   one of the frame types below
//	flags  uint8   flagFin (DATA, OPEN) or flagAck (PING); no others
//	stream uint32  the stream; 0 for PING and GOAWAY, never 0 otherwise
//	value  uint32  DATA, OPEN: the payload's length; WINDOW: the credit
//	               granted; RESET, GOAWAY: a code; PING: an opaque value
//
// Every integer is big-endian.
const headerLen = 10

// Size limits of the protocol. A frame over them is a protocol error, so
// that a peer cannot make the reader allocate more than this per frame.
const (
	// MaxFrame is the largest DATA payload a frame may carry.
	MaxFrame = 1 << 20
	// MaxOpen is the largest OPEN payload (the stream's metadata).
	MaxOpen = 16 << 10
	// InitialWindow is the credit each end of a new stream starts with:
	// the bytes it may send before the receiver grants more.
	InitialWindow = 256 << 10
	// maxCredit bounds the credit a stream may hold, so that window
	// arithmetic never overflows.
	maxCredit = 1 << 30
)

type frameType uint8

const (
	typeData   frameType = iota // bytes of a stream; flagFin ends its direction
	typeOpen                    // a new stream, with its metadata
	typeWindow                  // more credit for a stream
	typeReset                   // a stream ends at once, both ways, with a code
	typePing                    // liveness and round-trip time; flagAck answers
	typeGoAway                  // the sender accepts no new streams
	numTypes
)

var typeNames = [numTypes]string{"DATA", "OPEN", "WINDOW", "RESET", "PING", "GOAWAY"}

func (t frameType) String() string {
	if t < numTypes {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

const (
	flagFin uint8 = 1 << 0 // DATA, OPEN: the sender writes no more on the stream
	flagAck uint8 = 1 << 0 // PING: an answer, carrying the ping's value
)

// header is a frame's header, decoded.
type header struct {
	typ    frameType
	flags  uint8
	stream uint32
	value  uint32
}

func (h header) encode(b *[headerLen]byte) {
	b[0] = byte(h.typ)
	b[1] = h.flags
	binary.BigEndian.PutUint32(b[2:6], h.stream)
	binary.BigEndian.PutUint32(b[6:10], h.value)
}

// payloadLen is the number of payload bytes that follow the header.
func (h header) payloadLen() int {
	if h.typ == typeData || h.typ == typeOpen {
		return int(h.value)
	}
	return 0
}

// parseHeader decodes and checks a header: a header it returns is one the
// session can act on without further checks of its own fields.
func parseHeader(b []byte) (header, error) {
	h := header{
		typ:    frameType(b[0]),
		flags:  b[1],
		stream: binary.BigEndian.Uint32(b[2:6]),
		value:  binary.BigEndian.Uint32(b[6:10]),
	}
	if h.typ >= numTypes {
		return h, protocolErrorf("unknown frame type %d", b[0])
	}
	allowed := uint8(0)
	switch h.typ {
	case typeData, typeOpen:
		allowed = flagFin
	case typePing:
		allowed = flagAck
	}
	if h.flags&^allowed != 0 {
		return h, protocolErrorf("%v frame with flags %#x", h.typ, h.flags)
	}
	connLevel := h.typ == typePing || h.typ == typeGoAway
	if connLevel != (h.stream == 0) {
		return h, protocolErrorf("%v frame on stream %d", h.typ, h.stream)
	}
	switch {
	case h.typ == typeData && h.value > MaxFrame:
		return h, protocolErrorf("DATA frame of %d bytes, over the limit of %d", h.value, MaxFrame)
	case h.typ == typeOpen && h.value > MaxOpen:
		return h, protocolErrorf("OPEN frame of %d bytes, over the limit of %d", h.value, MaxOpen)
	case h.typ == typeWindow && (h.value == 0 || h.value > maxCredit):
		return h, protocolErrorf("WINDOW frame granting %d bytes", h.value)
	}
	return h, nil
}

// ProtocolError means the peer broke the framing rules; the session ends.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "mux: protocol error: " + e.Msg }

func protocolErrorf(format string, args ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, args...)}
}
