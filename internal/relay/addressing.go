package relay

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/auth"
)

// Target is where a user request goes: a device and the path on it.
type Target struct {
	Device  string
	Path    string // the decoded path on the device, starting with "/"
	RawPath string // the path's original encoding when it differs from Path's default encoding
}

// AddressError explains why a request names no usable device.
type AddressError struct{ Msg string }

func (e *AddressError) Error() string   { return e.Msg }
func (e *AddressError) HTTPStatus() int { return http.StatusBadRequest }

// ParseTarget finds the device a user request is for: the path prefix
// /client/<device>/… wins, else the X-Server-Name header names it and the
// path is unchanged. ok is false when the request names no device at all.
func ParseTarget(u *url.URL, h http.Header) (t Target, ok bool, err error) {
	escaped := u.EscapedPath()
	if rest, found := strings.CutPrefix(escaped, "/client/"); found || escaped == "/client" {
		t, err := parseClientPath(rest)
		return t, true, err
	}
	name := h.Get("X-Server-Name")
	if name == "" {
		return Target{}, false, nil
	}
	if err := validateDevice(name); err != nil {
		return Target{}, true, err
	}
	path := u.Path
	if path == "" && u.Opaque == "" {
		path = "/" // an absolute-form target without a path
	}
	if !strings.HasPrefix(path, "/") {
		return Target{}, true, &AddressError{Msg: "the request target must be an absolute path (not '*' or an opaque URL) to reach a device"}
	}
	if hasDotSegment(path) {
		return Target{}, true, &AddressError{Msg: "the path has '.' or '..' segments; send a normalized path"}
	}
	return Target{Device: name, Path: path, RawPath: u.RawPath}, true, nil
}

// parseClientPath splits "<device>/<rest>" (escaped) into a target.
func parseClientPath(rest string) (Target, error) {
	seg, tail, _ := strings.Cut(rest, "/")
	if seg == "" {
		return Target{}, &AddressError{Msg: "no device named: use /client/<device>/<path> or the X-Server-Name header"}
	}
	device, err := url.PathUnescape(seg)
	if err != nil {
		return Target{}, &AddressError{Msg: fmt.Sprintf("device name in the path is badly escaped: %v", err)}
	}
	if err := validateDevice(device); err != nil {
		return Target{}, err
	}
	rawPath := "/" + tail
	path, err := url.PathUnescape(rawPath)
	if err != nil {
		return Target{}, &AddressError{Msg: fmt.Sprintf("path is badly escaped: %v", err)}
	}
	if hasDotSegment(path) {
		return Target{}, &AddressError{Msg: "the path has '.' or '..' segments; send a normalized path"}
	}
	t := Target{Device: device, Path: path}
	if (&url.URL{Path: path}).EscapedPath() != rawPath {
		t.RawPath = rawPath
	}
	return t, nil
}

// validateDevice checks a device name, as a 400 for the user.
func validateDevice(name string) error {
	if err := auth.ValidateDeviceName(name); err != nil {
		return &AddressError{Msg: err.Error()}
	}
	return nil
}

// hasDotSegment reports whether path has a "." or ".." segment, which could
// climb out of a backend path prefix; clients normalize them away.
func hasDotSegment(path string) bool {
	for seg := range strings.SplitSeq(path, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}
