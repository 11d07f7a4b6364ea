package relay

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/switchboard-relay/switchboard/internal/auth"
)

// Target is where a user request goes: a device and the path on it. It is
// parsed once, by ParseTarget, and handed on (to the user's authorizer,
// to the proxy's rewrite) rather than read again from the request.
type Target struct {
	Device  string
	Path    string // the decoded path on the device, starting with "/"
	RawPath string // the path's original encoding when it differs from Path's default encoding
	// ByPath: the request named the device by path (/client/<device>/…),
	// as browsers do, rather than by the X-Server-Name header.
	ByPath bool
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
	if err := checkPath(path); err != nil {
		return Target{}, true, err
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
	if err := checkPath(path); err != nil {
		return Target{}, err
	}
	t := Target{Device: device, Path: path, ByPath: true}
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

// checkPath refuses a decoded path that some backend could take to climb
// above the prefix it serves, or cut short: a "." or ".." segment, also
// when a backend cuts ";" parameters ("..;"), takes "\" for "/" ("..\"),
// or decodes the path once more ("%252e%252e"); bytes that are not UTF-8
// (the overlong "%c0%ae" that old decoders read as "."); and control
// characters ("%00", which C backends take for the path's end). Escaped
// slashes inside a segment ("a%2Fb") and every other escape stay as sent.
func checkPath(path string) error {
	if hasDotSegment(path) {
		return &AddressError{Msg: "the path has '.' or '..' segments (also written '..;', '..\\' or escaped), which could climb out of the device's path prefix; send a normalized path"}
	}
	if again, err := url.PathUnescape(path); err == nil && again != path && hasDotSegment(again) {
		return &AddressError{Msg: "the path has '.' or '..' segments once decoded twice (%252e%252e); send a normalized path"}
	}
	if !utf8.ValidString(path) {
		return &AddressError{Msg: "the path is not UTF-8 once decoded (an overlong escape such as %c0%ae?); escape the path's characters as UTF-8"}
	}
	if i := strings.IndexFunc(path, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(path[i:])
		return &AddressError{Msg: fmt.Sprintf("the path has the control character %s; such characters are not passed to devices", url.PathEscape(string(r)))}
	}
	return nil
}

// hasDotSegment reports whether path has a "." or ".." segment, which could
// climb out of a backend path prefix; clients normalize them away. Segments
// are split at "/" and "\", and a segment's ";" parameters are ignored.
func hasDotSegment(path string) bool {
	for seg := range strings.FieldsFuncSeq(path, isPathSeparator) {
		seg, _, _ = strings.Cut(seg, ";")
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// isPathSeparator reports whether a backend may take r for "/".
func isPathSeparator(r rune) bool { return r == '/' || r == '\\' }
