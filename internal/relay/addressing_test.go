package relay

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/auth"
)

// parseRequestTarget parses a request-target the way net/http's server does.
func parseRequestTarget(t testing.TB, target string) *url.URL {
	t.Helper()
	u, err := url.ParseRequestURI(target)
	if err != nil {
		t.Fatalf("parse request target %q: %v", target, err)
	}
	return u
}

func TestParseTarget(t *testing.T) {
	tests := []struct {
		name    string
		target  string // the request-target as on the request line
		header  string // X-Server-Name, "" for none
		want    Target
		unnamed bool   // the request names no device at all
		wantErr string // a substring of the error; "" for success
	}{
		// Path prefix.
		{name: "prefix with path", target: "/client/dev/a/b", want: Target{ByPath: true, Device: "dev", Path: "/a/b"}},
		{name: "prefix alone is root", target: "/client/dev", want: Target{ByPath: true, Device: "dev", Path: "/"}},
		{name: "prefix with slash is root", target: "/client/dev/", want: Target{ByPath: true, Device: "dev", Path: "/"}},
		{name: "prefix keeps trailing slash", target: "/client/dev/a/", want: Target{ByPath: true, Device: "dev", Path: "/a/"}},
		{name: "prefix keeps query out of path", target: "/client/dev/a?x=1&y=%2F", want: Target{ByPath: true, Device: "dev", Path: "/a"}},
		{name: "prefix keeps double slashes", target: "/client/dev//etc", want: Target{ByPath: true, Device: "dev", Path: "//etc"}},
		{name: "prefix wins over header", target: "/client/dev/x", header: "other", want: Target{ByPath: true, Device: "dev", Path: "/x"}},
		{name: "escaped slash keeps RawPath", target: "/client/dev/a%2Fb/c", want: Target{ByPath: true, Device: "dev", Path: "/a/b/c", RawPath: "/a%2Fb/c"}},
		{name: "escaped space needs no RawPath", target: "/client/dev/a%20b", want: Target{ByPath: true, Device: "dev", Path: "/a b"}},
		{name: "unusual escape keeps RawPath", target: "/client/dev/%41", want: Target{ByPath: true, Device: "dev", Path: "/A", RawPath: "/%41"}},
		{name: "escaped device name", target: "/client/d%65v/x", want: Target{ByPath: true, Device: "dev", Path: "/x"}},
		{name: "device with dots and dashes", target: "/client/lab-1.rig_2/x", want: Target{ByPath: true, Device: "lab-1.rig_2", Path: "/x"}},
		{name: "63-char device", target: "/client/" + strings.Repeat("a", 63) + "/", want: Target{ByPath: true, Device: strings.Repeat("a", 63), Path: "/"}},
		{name: "kubectl API path", target: "/client/dev/api/v1/namespaces/default/pods/web-1/log", want: Target{ByPath: true, Device: "dev", Path: "/api/v1/namespaces/default/pods/web-1/log"}},
		{name: "gRPC path", target: "/client/dev/grpc.health.v1.Health/Check", want: Target{ByPath: true, Device: "dev", Path: "/grpc.health.v1.Health/Check"}},
		{name: "UTF-8 escapes", target: "/client/dev/caf%C3%A9/%E2%82%AC", want: Target{ByPath: true, Device: "dev", Path: "/café/€"}},
		{name: "a parameter on a plain segment", target: "/client/dev/a;jsessionid=1/b", want: Target{ByPath: true, Device: "dev", Path: "/a;jsessionid=1/b"}},
		{name: "escaped backslash inside a segment", target: "/client/dev/a%5Cb", want: Target{ByPath: true, Device: "dev", Path: "/a\\b"}},
		{name: "escaped percent", target: "/client/dev/100%25/x", want: Target{ByPath: true, Device: "dev", Path: "/100%/x"}},
		{name: "escaped percent before 2e", target: "/client/dev/v%252e1", want: Target{ByPath: true, Device: "dev", Path: "/v%2e1"}},
		{name: "dots around an escaped slash", target: "/client/dev/a.%2F.b", want: Target{ByPath: true, Device: "dev", Path: "/a./.b", RawPath: "/a.%2F.b"}},
		{name: "dots inside a segment are fine", target: "/client/dev/a..b/.c/d.", want: Target{ByPath: true, Device: "dev", Path: "/a..b/.c/d."}},

		// Header mode.
		{name: "header keeps path", target: "/a/b?q=1", header: "dev", want: Target{Device: "dev", Path: "/a/b"}},
		{name: "header keeps RawPath", target: "/a%2Fb", header: "dev", want: Target{Device: "dev", Path: "/a/b", RawPath: "/a%2Fb"}},
		{name: "header with clientele path", target: "/clientele/x", header: "dev", want: Target{Device: "dev", Path: "/clientele/x"}},
		{name: "header with escaped client path", target: "/client%2Fdev/x", header: "dev", want: Target{Device: "dev", Path: "/client/dev/x", RawPath: "/client%2Fdev/x"}},

		// Nothing named.
		{name: "no prefix no header", target: "/a/b", unnamed: true},
		{name: "root no header", target: "/", unnamed: true},
		{name: "clientele is no prefix", target: "/clientele", unnamed: true},

		// Errors.
		{name: "bare /client", target: "/client", wantErr: "no device named"},
		{name: "/client/ without name", target: "/client/", wantErr: "no device named"},
		{name: "/client// without name", target: "/client//x", wantErr: "no device named"},
		{name: "escaped slash in device", target: "/client/a%2Fb/x", wantErr: "invalid device name"},
		{name: "bad character in device", target: "/client/de$v/x", wantErr: "invalid device name"},
		{name: "space in device", target: "/client/de%20v/x", wantErr: "invalid device name"},
		{name: "64-char device", target: "/client/" + strings.Repeat("a", 64) + "/x", wantErr: "1 to 63"},
		{name: "device dot", target: "/client/./x", wantErr: "invalid device name"},
		{name: "device dot dot", target: "/client/../x", wantErr: "invalid device name"},
		{name: "device leading dot", target: "/client/.hidden/x", wantErr: "must not start with '.'"},
		{name: "escaped dot dot device", target: "/client/%2e%2e/x", wantErr: "invalid device name"},
		{name: "dot dot segment", target: "/client/dev/a/../b", wantErr: "'..'"},
		{name: "trailing dot dot", target: "/client/dev/a/..", wantErr: "'..'"},
		{name: "dot segment", target: "/client/dev/./b", wantErr: "'..'"},
		{name: "escaped dot dot", target: "/client/dev/%2e%2e/b", wantErr: "'..'"},
		{name: "upper escaped dot dot", target: "/client/dev/%2E%2E/b", wantErr: "'..'"},
		{name: "half escaped dot dot", target: "/client/dev/.%2e/b", wantErr: "'..'"},
		{name: "escaped slash and dot dot", target: "/client/dev/a%2F..%2Fb", wantErr: "'..'"},
		{name: "dot dot with a parameter", target: "/client/dev/a/..;/b", wantErr: "'..'"},
		{name: "dot with a parameter", target: "/client/dev/.;x=1/b", wantErr: "'..'"},
		{name: "escaped dot dot with a parameter", target: "/client/dev/%2e%2e%3b/b", wantErr: "'..'"},
		{name: "escaped backslash dot dot", target: "/client/dev/a/..%5cb", wantErr: "'..'"},
		{name: "upper escaped backslash dot dot", target: "/client/dev/%2e%2e%5C%2e%2e%5Cetc", wantErr: "'..'"},
		{name: "raw backslash dot dot", target: "/client/dev/..\\b", wantErr: "'..'"},
		{name: "double escaped dot dot", target: "/client/dev/%252e%252e/b", wantErr: "decoded twice"},
		{name: "double escaped slash and dot dot", target: "/client/dev/a%252f..%252fb", wantErr: "decoded twice"},
		{name: "overlong dot", target: "/client/dev/%c0%ae%c0%ae/b", wantErr: "UTF-8"},
		{name: "overlong slash", target: "/client/dev/..%c0%afb", wantErr: "UTF-8"},
		{name: "three-byte overlong dot", target: "/client/dev/%e0%80%ae/b", wantErr: "UTF-8"},
		{name: "escaped NUL", target: "/client/dev/a%00.png", wantErr: "%00"},
		{name: "escaped newline", target: "/client/dev/a%0Ab", wantErr: "%0A"},
		{name: "escaped C1 control", target: "/client/dev/a%C2%85b", wantErr: "%C2%85"},
		{name: "header dot dot with a parameter", target: "/a/..;/b", header: "dev", wantErr: "'..'"},
		{name: "header escaped backslash dot dot", target: "/a/%2e%2e%5cb", header: "dev", wantErr: "'..'"},
		{name: "header double escaped dot dot", target: "/a/%252e%252e/b", header: "dev", wantErr: "decoded twice"},
		{name: "header overlong dot", target: "/a/%c0%ae%c0%ae/b", header: "dev", wantErr: "UTF-8"},
		{name: "header escaped NUL", target: "/a%00", header: "dev", wantErr: "%00"},
		{name: "header bad name", target: "/x", header: "bad name!", wantErr: "invalid device name"},
		{name: "header 64-char name", target: "/x", header: strings.Repeat("b", 64), wantErr: "1 to 63"},
		{name: "header slash name", target: "/x", header: "a/b", wantErr: "invalid device name"},
		{name: "header dot dot segment", target: "/a/../b", header: "dev", wantErr: "'..'"},
		{name: "header escaped dot dot", target: "/a/%2E%2E/b", header: "dev", wantErr: "'..'"},
		{name: "header escaped dot dot with escaped slash", target: "/a%2F%2e%2e%2Fb", header: "dev", wantErr: "'..'"},

		// Request-targets in absolute and asterisk form, as net/http passes them on.
		{name: "absolute form with prefix", target: "http://relay.example/client/dev/x?q=1", header: "other", want: Target{ByPath: true, Device: "dev", Path: "/x"}},
		{name: "absolute form in header mode", target: "http://relay.example/a/b", header: "dev", want: Target{Device: "dev", Path: "/a/b"}},
		{name: "absolute form without a path is root", target: "http://relay.example", header: "dev", want: Target{Device: "dev", Path: "/"}},
		{name: "absolute form without a path and a query", target: "http://relay.example?x=1", header: "dev", want: Target{Device: "dev", Path: "/"}},
		{name: "asterisk form in header mode", target: "*", header: "dev", wantErr: "path"},
		{name: "opaque form in header mode", target: "http:..%2f..%2fsecret", header: "dev", wantErr: "path"},
		{name: "opaque form naming no device", target: "http:x", unnamed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.header != "" {
				h.Set("X-Server-Name", tt.header)
			}
			got, named, err := ParseTarget(parseRequestTarget(t, tt.target), h)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("ParseTarget(%q) = %+v, want an error containing %q", tt.target, got, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %q does not contain %q", err, tt.wantErr)
				}
				var ae *AddressError
				if !errors.As(err, &ae) || ae.HTTPStatus() != http.StatusBadRequest {
					t.Fatalf("error %v (%T) is not an AddressError answered 400", err, err)
				}
				if !named {
					t.Fatalf("a bad address reported as naming no device")
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseTarget(%q): %v", tt.target, err)
			}
			if named == tt.unnamed {
				t.Fatalf("named = %v, want %v", named, !tt.unnamed)
			}
			if got != tt.want {
				t.Fatalf("ParseTarget(%q, %q) = %+v, want %+v", tt.target, tt.header, got, tt.want)
			}
		})
	}
}

// TestParseTargetForwardsIntact checks that what ParseTarget returns, put
// back into a URL as the reverse proxy's Rewrite does, is sent on the wire as
// the user wrote the path after the device.
func TestParseTargetForwardsIntact(t *testing.T) {
	tests := []struct{ target, wire string }{
		{"/client/dev/a%2Fb/c", "/a%2Fb/c"},
		{"/client/dev/a%20b", "/a%20b"},
		{"/client/dev/%41", "/%41"},
		{"/client/dev", "/"},
		{"/client/dev/~user/x;y", "/~user/x;y"},
	}
	for _, tt := range tests {
		got, _, err := ParseTarget(parseRequestTarget(t, tt.target), http.Header{})
		if err != nil {
			t.Fatalf("ParseTarget(%q): %v", tt.target, err)
		}
		out := url.URL{Path: got.Path, RawPath: got.RawPath}
		if out.EscapedPath() != tt.wire {
			t.Errorf("%q is forwarded as %q, want %q", tt.target, out.EscapedPath(), tt.wire)
		}
		if err := auth.ValidateDeviceName(got.Device); err != nil {
			t.Errorf("device %q: %v", got.Device, err)
		}
	}
}
