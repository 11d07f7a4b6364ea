package auth

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/switchboard-relay/switchboard/internal/service"
)

// Limits on what a token request may carry.
const (
	MaxDeviceNameLen = 63  // longest device name
	maxPatternLen    = 128 // longest device glob
	maxNameLen       = 128 // longest token name
	maxDevices       = 256 // most device names or globs per token
)

var (
	// ErrInvalidDevice is wrapped by the errors of ValidateDeviceName and
	// ValidateDevicePattern.
	ErrInvalidDevice = errors.New("invalid device name")
	// ErrInvalidRequest is wrapped by the errors of a CreateRequest that
	// cannot be granted as asked.
	ErrInvalidRequest = errors.New("invalid token request")
)

// ValidateDeviceName checks that name can name a device: 1 to 63 letters,
// digits, '.', '_' or '-', not starting with '.'.
func ValidateDeviceName(name string) error {
	if name == "" || len(name) > MaxDeviceNameLen {
		return deviceErrorf(name, "use 1 to %d characters", MaxDeviceNameLen)
	}
	if name[0] == '.' {
		return deviceErrorf(name, "must not start with '.'")
	}
	for i := range len(name) {
		if !isNameByte(name[i]) {
			return deviceErrorf(name, "only letters, digits, '.', '_' and '-' are allowed")
		}
	}
	return nil
}

// ValidateDevicePattern checks that p is a device name, or a glob over device
// names in the syntax of path.Match, such as "robot-*" or "lab-[0-9]".
func ValidateDevicePattern(p string) error {
	if !strings.ContainsAny(p, "*?[") {
		return ValidateDeviceName(p)
	}
	if len(p) > maxPatternLen {
		return deviceErrorf(p, "a pattern has at most %d characters", maxPatternLen)
	}
	if p[0] == '.' {
		return deviceErrorf(p, "must not start with '.'")
	}
	for i := range len(p) {
		if c := p[i]; !isNameByte(c) && !strings.ContainsRune("*?[]^", rune(c)) {
			return deviceErrorf(p, "a pattern may use letters, digits, '.', '_', '-' and the glob characters * ? [ ] ^")
		}
	}
	if _, err := path.Match(p, ""); err != nil {
		return deviceErrorf(p, "malformed glob (unbalanced '['?)")
	}
	return nil
}

// validateEntry checks one entry of a token's device list: a device name
// or glob, or DEVICE/SERVICE (the device a name or glob), which allows
// that one service through switchboard connect and nothing else of the
// device.
func validateEntry(e string) error {
	pat, svc, ok := strings.Cut(e, "/")
	if err := ValidateDevicePattern(pat); err != nil {
		return err
	}
	if !ok {
		return nil
	}
	if err := service.CheckName(svc); err != nil {
		return fmt.Errorf("%w %q: the service after '/' (DEVICE/SERVICE): %w", ErrInvalidDevice, e, err)
	}
	return nil
}

func isNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

func deviceErrorf(name, format string, args ...any) error {
	return fmt.Errorf("%w %q: %s", ErrInvalidDevice, name, fmt.Sprintf(format, args...))
}

// requestError marks an error in a CreateRequest while keeping the message
// of the underlying problem.
type requestError struct{ err error }

func (e *requestError) Error() string   { return e.err.Error() }
func (e *requestError) Unwrap() []error { return []error{ErrInvalidRequest, e.err} }

func requestErrorf(format string, args ...any) error {
	return &requestError{err: fmt.Errorf(format, args...)}
}

// CreateRequest asks for a new token.
type CreateRequest struct {
	Kind Kind
	// Name says who or what holds the token, for people reading lists. It is
	// required for user tokens (the user's name) and optional otherwise.
	Name string
	// Devices are device names or globs. An agent token needs at least one;
	// a user token with none may use every device; an admin token takes none.
	Devices []string
}

// normalize trims the request and checks it, returning what will be stored.
func (r CreateRequest) normalize() (CreateRequest, error) {
	r.Name = strings.TrimSpace(r.Name)
	if err := validateTokenName(r.Kind, r.Name); err != nil {
		return r, err
	}
	devices, err := normalizeDevices(r.Devices)
	if err != nil {
		return r, err
	}
	r.Devices = devices
	scoped := slices.ContainsFunc(devices, func(d string) bool { return strings.Contains(d, "/") })
	switch {
	case r.Kind != KindUser && scoped:
		return r, requestErrorf("only a user token may be scoped to a device's services (DEVICE/SERVICE); an agent serves devices whole")
	case !r.Kind.Valid():
		return r, requestErrorf("unknown token kind %q; use %q, %q or %q", r.Kind, KindAgent, KindUser, KindAdmin)
	case r.Kind == KindAgent && len(r.Devices) == 0:
		return r, requestErrorf("an agent token needs at least one device name or glob it may serve")
	case r.Kind == KindAdmin && len(r.Devices) > 0:
		return r, requestErrorf("an admin token is not scoped to devices; leave the device list empty")
	}
	return r, nil
}

func validateTokenName(kind Kind, name string) error {
	switch {
	case kind == KindUser && name == "":
		return requestErrorf("a user token needs a name: the user it is for")
	case utf8.RuneCountInString(name) > maxNameLen:
		return requestErrorf("token name is longer than %d characters", maxNameLen)
	case !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl):
		return requestErrorf("token name %q contains control characters or invalid UTF-8", name)
	}
	return nil
}

// normalizeDevices trims, checks and de-duplicates device names and globs,
// keeping their order.
func normalizeDevices(devices []string) ([]string, error) {
	if len(devices) > maxDevices {
		return nil, requestErrorf("%d devices listed; a token lists at most %d (use a glob such as robot-*)", len(devices), maxDevices)
	}
	var out []string
	seen := make(map[string]bool, len(devices))
	for _, d := range devices {
		d = strings.TrimSpace(d)
		if err := validateEntry(d); err != nil {
			return nil, &requestError{err: err}
		}
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out, nil
}
