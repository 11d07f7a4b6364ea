package wire

import "testing"

// TestRequestID: an id made for a device carries the device and its
// maker's digits, and malformed ids name neither.
func TestRequestID(t *testing.T) {
	id := NewRequestID("robot-1", "0a1b2c3d")
	if len(id) != len("robot-1:")+requestIDHex || id == NewRequestID("robot-1", "0a1b2c3d") {
		t.Fatalf("NewRequestID: %q, want a fresh id of %d hex digits", id, requestIDHex)
	}
	if d, ok := RequestDevice(id); !ok || d != "robot-1" || RequestOwner(id) != "0a1b2c3d" {
		t.Errorf("%q: device %q (%v), owner %q", id, d, ok, RequestOwner(id))
	}
	if id := NewRequestID("robot-1", ""); len(id) != len("robot-1:")+requestIDHex {
		t.Errorf("without an owner: %q", id)
	}
	for _, c := range []struct {
		id, device, owner string
		ok                bool
	}{
		{"dev:0123456789abcdef", "dev", "01234567", true},
		{"dev:01234567", "dev", "01234567", true},
		{"dev:0123", "dev", "", true},
		{"a:b:0123456789", "a:b", "01234567", true},
		{"dev:", "", "", false},
		{":0123456789", "", "", false},
		{"0123456789", "", "", false},
		{"", "", "", false},
	} {
		d, ok := RequestDevice(c.id)
		if d != c.device || ok != c.ok || RequestOwner(c.id) != c.owner {
			t.Errorf("%q: device %q (%v), owner %q; want %q (%v), %q", c.id, d, ok, RequestOwner(c.id), c.device, c.ok, c.owner)
		}
	}
}
