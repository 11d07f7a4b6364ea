package relay

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/switchboard-relay/switchboard/internal/auth"
)

// FuzzParseTarget feeds arbitrary request-targets and X-Server-Name values
// to ParseTarget. It must never panic, and what it accepts must be safe to
// forward: a valid device name, a path starting with "/" without dot
// segments, and a RawPath that is an encoding of that path.
func FuzzParseTarget(f *testing.F) {
	for _, seed := range []struct{ target, header string }{
		{"/client/dev/", ""},
		{"/client/dev", ""},
		{"/client/dev/echo/a%2Fb/c?x=1&y=two", ""},
		{"/client/robot-7.lab_2/api/v1/pods?watch=true", ""},
		{"/client/dev/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true", ""},
		{"/client/dev/%2e%2e/etc/passwd", ""},
		{"/client/dev/a/../b", ""},
		{"/client/a%2Fb/x", ""},
		{"/client/", ""},
		{"/client", ""},
		{"/client//x", ""},
		{"/client/" + strings.Repeat("a", 64) + "/", ""},
		{"/echo/by-header", "dev"},
		{"/grpc.health.v1.Health/Check", "grpc-dev"},
		{"/a%2F%2e%2e%2Fb", "dev"},
		{"/healthz", "dev"},
		{"/server/request?server=dev", ""},
		{"/", ""},
		{"/x", "bad name!"},
		{"/client/dev/x", "other"},
		{"/client%2Fdev/x", "dev"},
		{"/client/d%65v/%41", ""},
		{"http://relay.example/client/dev/x?q=1", ""},
		{"http://relay.example/a/b", "dev"},
		{"http://relay.example", "dev"},
		{"*", "dev"},
		{"http:..%2f..%2fsecret", "dev"},
		{"/client/dev/a/..;/b", ""},
		{"/client/dev/..%5c..%5cetc", ""},
		{"/client/dev/%c0%ae%c0%ae/x", ""},
		{"/client/dev/%252e%252e/x", ""},
		{"/a%00b", "dev"},
	} {
		f.Add(seed.target, seed.header)
	}
	f.Fuzz(func(t *testing.T, target, header string) {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return // net/http answers 400 before the handler
		}
		h := http.Header{}
		if header != "" {
			h["X-Server-Name"] = []string{header}
		}
		got, named, err := ParseTarget(u, h)
		if err != nil {
			var ae *AddressError
			if !errors.As(err, &ae) || ae.HTTPStatus() != http.StatusBadRequest {
				t.Fatalf("ParseTarget(%q, %q): error %v (%T) is not a 400 AddressError", target, header, err, err)
			}
			if !named {
				t.Fatalf("ParseTarget(%q, %q): error %v but named = false", target, header, err)
			}
			if got != (Target{}) {
				t.Fatalf("ParseTarget(%q, %q): error %v with a target %+v", target, header, err, got)
			}
			return
		}
		if !named {
			if header != "" {
				t.Fatalf("ParseTarget(%q, %q): the header names a device but named = false", target, header)
			}
			if got != (Target{}) {
				t.Fatalf("ParseTarget(%q, %q): named = false with a target %+v", target, header, got)
			}
			return
		}
		if u.Opaque != "" {
			t.Fatalf("ParseTarget(%q, %q) = %+v: accepted an opaque target %q, which the target cannot carry", target, header, got, u.Opaque)
		}
		if err := auth.ValidateDeviceName(got.Device); err != nil {
			t.Fatalf("ParseTarget(%q, %q) = %+v: %v", target, header, got, err)
		}
		if !strings.HasPrefix(got.Path, "/") {
			t.Fatalf("ParseTarget(%q, %q) = %+v: the path does not start with \"/\"", target, header, got)
		}
		for seg := range strings.FieldsFuncSeq(got.Path, func(r rune) bool { return r == '/' || r == '\\' }) {
			if seg, _, _ = strings.Cut(seg, ";"); seg == "." || seg == ".." {
				t.Fatalf("ParseTarget(%q, %q) = %+v: the path has a dot segment", target, header, got)
			}
		}
		if !utf8.ValidString(got.Path) || strings.ContainsFunc(got.Path, unicode.IsControl) {
			t.Fatalf("ParseTarget(%q, %q) = %+v: the path is not UTF-8 or has a control character", target, header, got)
		}
		if got.RawPath != "" {
			dec, err := url.PathUnescape(got.RawPath)
			if err != nil || dec != got.Path {
				t.Fatalf("ParseTarget(%q, %q) = %+v: RawPath decodes to %q (%v), not Path", target, header, got, dec, err)
			}
		}
		// The forwarded request carries the same path.
		out := url.URL{Path: got.Path, RawPath: got.RawPath}
		if dec, err := url.PathUnescape(out.EscapedPath()); err != nil || dec != got.Path {
			t.Fatalf("ParseTarget(%q, %q) = %+v: forwarded as %q", target, header, got, out.EscapedPath())
		}
		if escaped := u.EscapedPath(); strings.HasPrefix(escaped, "/client/") || escaped == "/client" {
			// The path prefix wins: the device is its first segment.
			seg, _, _ := strings.Cut(strings.TrimPrefix(escaped, "/client/"), "/")
			if dev, err := url.PathUnescape(seg); err != nil || dev != got.Device {
				t.Fatalf("ParseTarget(%q, %q) = %+v: the device is not the path's %q", target, header, got, seg)
			}
			return
		}
		if u.Path == "" && got.Path == "/" && got.RawPath == "" {
			return // absolute form without a path: the root
		}
		if got.Device != header || got.Path != u.Path || got.RawPath != u.RawPath {
			t.Fatalf("ParseTarget(%q, %q) = %+v: header mode changed the target (path %q raw %q)", target, header, got, u.Path, u.RawPath)
		}
	})
}
