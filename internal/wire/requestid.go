package wire

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// A request id names one request of the protocol: "<device>:<hex>", the
// device it is for and 32 lowercase hex digits (any hex from the reference
// relay). The hex of an id a Switchboard relay makes starts with the 8 hex
// digits of that relay's id (without its "rl-"), so that any relay of the
// fleet can send an agent's answer to the relay that holds the request.

// requestIDHex is how many hex digits follow the device in a request id.
const requestIDHex = 32

// OwnerDigits is how many hex digits of a request id name the relay that
// made it.
const OwnerDigits = 8

// NewRequestID returns a fresh request id for device, its hex starting
// with owner (OwnerDigits lowercase hex digits, or "" for none).
func NewRequestID(device, owner string) string {
	var r [requestIDHex / 2]byte
	rand.Read(r[:])
	h := hex.EncodeToString(r[:])
	return device + ":" + owner + h[min(len(owner), len(h)):]
}

// RequestDevice returns the device part of a request id; ok is false when
// id has none, or no hex after it.
func RequestDevice(id string) (device string, ok bool) {
	i := strings.LastIndexByte(id, ':')
	if i <= 0 || i == len(id)-1 {
		return "", false
	}
	return id[:i], true
}

// RequestOwner returns the OwnerDigits that start a request id's hex part:
// the relay that made it, if a Switchboard relay did. It returns "" when
// the id has no device part or too short a hex part.
func RequestOwner(id string) string {
	i := strings.LastIndexByte(id, ':')
	if i <= 0 || len(id)-(i+1) < OwnerDigits {
		return ""
	}
	return id[i+1 : i+1+OwnerDigits]
}
