// Package forward carries users' HTTP requests from a relay that does not
// hold their device to the relay that does, as byte streams: the holder
// splices each stream onto a stream of the device's version 2 agent
// tunnel and parses no HTTP; the forwarding relay runs its HTTP client
// over the stream, as it would over its own agent's tunnel.
//
// Each forwarding relay keeps one multiplexed session (package mux, over
// an HTTP/1.1 Upgrade to switchboard-forward/1 at /switchboard/forward)
// per holder, shared by every device that holder has. Each stream's
// opening names the device and carries the peer signature for it (package
// peer), so that a captured opening is good for one device for a minute,
// as a forwarded request's header is. The holder answers a stream it takes
// with the announcement of the agent's HTTP service, then the agent's
// bytes; one it cannot serve here it resets with CodeUnavailable, and the
// forwarding relay sends the request over HTTP instead (Unavailable): a
// version 1 or long-poll agent, no agent, a relay from before this
// package, an access code to spend.
//
//	holder:     &forward.Server{Open: pool, Verify: signer.VerifySignature, ...}
//	forwarding: f := forward.NewForwarder(cfg); resp, err := f.RoundTrip(req, holderID, address)
package forward

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/service"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// Protocol names the session in the Upgrade header.
const Protocol = "switchboard-forward/1"

// Path is the endpoint a forwarding relay opens its session on.
const Path = "/switchboard/forward"

// SessionScope is what a session's upgrade is signed for, in place of a
// device: no device is named so (device names have no slash), so the
// signature opens a session and reaches no device.
const SessionScope = "/forward"

// Reset codes of the holder, beside the agent's own (tunnel.CodeUnknownService
// and the two after it), which it passes on as they are.
const (
	// CodeUnavailable: the holder serves no stream to the device's HTTP
	// service (no version 2 agent of it takes requests here, the signature
	// was refused). Nothing reached the device; the
	// request goes over HTTP.
	CodeUnavailable = mux.CodeApplication + 0x20
	// CodeAgentLost: the agent's tunnel ended under the stream. What was
	// sent may have reached the device.
	CodeAgentLost = mux.CodeApplication + 0x21
	// CodeBusy: the device has as many requests in flight as the holder
	// sends it (--max-streams-per-device). Nothing reached it; the user
	// gets 503 at once.
	CodeBusy = mux.CodeApplication + 0x22
)

// ErrUnavailable means the holder offers no stream to the device's HTTP
// service now: the caller forwards the request over HTTP. Nothing of the
// request was sent.
var ErrUnavailable = errors.New("the holder offers no stream forward to the device")

// BusyError is a holder's answer for a device that has as many requests
// in flight as it sends it: 503 with Retry-After, at once, as the holder's
// own *tunnel.BusyError is.
type BusyError struct {
	Device, Relay string
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("device %q is busy: relay %s, which holds it, sends it as many requests at once as it may; try again shortly", e.Device, e.Relay)
}

// Is makes the error match tunnel.ErrBusy.
func (e *BusyError) Is(target error) bool { return target == tunnel.ErrBusy }

// HTTPStatus returns 503.
func (e *BusyError) HTTPStatus() int { return http.StatusServiceUnavailable }

// RetryAfterDelay returns one second: requests in flight usually end soon.
func (e *BusyError) RetryAfterDelay() time.Duration { return time.Second }

// maxPreamble bounds the holder's announcement of the service.
const maxPreamble = service.MaxAnnouncement

// openMeta is a stream's opening: the device, a space, its signature.
func openMeta(device, signature string) []byte {
	return []byte(device + " " + signature)
}

// parseOpen reads a stream's opening.
func parseOpen(meta []byte) (device, signature string, err error) {
	device, signature, ok := strings.Cut(string(meta), " ")
	if !ok || device == "" || signature == "" {
		return "", "", fmt.Errorf("forward: a stream opening names no device and signature")
	}
	return device, signature, nil
}

// retireMeta is the opening of a notice from the holder: stream id of the
// forwarding relay's carries no new request.
func retireMeta(id uint32) []byte { return []byte("retire " + strconv.FormatUint(uint64(id), 10)) }

// parseRetire reads a notice's opening.
func parseRetire(meta []byte) (uint32, bool) {
	v, ok := strings.CutPrefix(string(meta), "retire ")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(v, 10, 32)
	return uint32(id), err == nil
}

// writePreamble writes the announcement of svc, length first.
func writePreamble(w io.Writer, svc service.Announced) error {
	b, err := json.Marshal(svc)
	if err != nil {
		return err
	}
	if len(b) > maxPreamble {
		return fmt.Errorf("forward: an announcement of %d bytes, over %d", len(b), maxPreamble)
	}
	buf := make([]byte, 2, 2+len(b))
	binary.BigEndian.PutUint16(buf, uint16(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// readPreamble reads what writePreamble wrote, and its raw bytes.
func readPreamble(r io.Reader) (service.Announced, []byte, error) {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return service.Announced{}, nil, err
	}
	size := int(binary.BigEndian.Uint16(n[:]))
	if size > maxPreamble {
		return service.Announced{}, nil, fmt.Errorf("forward: an announcement of %d bytes, over %d", size, maxPreamble)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return service.Announced{}, nil, err
	}
	var svc service.Announced
	if err := json.Unmarshal(b, &svc); err != nil {
		return service.Announced{}, nil, fmt.Errorf("forward: the holder's announcement: %w", err)
	}
	if svc.Kind != service.HTTP {
		return service.Announced{}, nil, fmt.Errorf("forward: the holder announced a %q service, not HTTP", svc.Kind)
	}
	return svc, b, nil
}
