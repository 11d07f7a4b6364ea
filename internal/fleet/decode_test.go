package fleet

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
	"unsafe"
)

// TestDecodeAttachmentSharesRepeatedStrings checks that directory records
// decode to what JSON says, and that what they repeat is held once: the
// device's name is its key's bytes, and relay ids and protocols are one
// copy across records.
func TestDecodeAttachmentSharesRepeatedStrings(t *testing.T) {
	at := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
	var got []Attachment
	for i := range 3 {
		want := Attachment{Device: fmt.Sprintf("dev-%d", i), RelayID: "relay-a", AttachedAt: at, Agents: 1,
			Protocol: "native", UpdatedAt: at, Standby: "relay-b"}
		data, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		key := deviceKey(want.Device)
		a, err := decodeAttachment(key, data)
		if err != nil {
			t.Fatal(err)
		}
		if a != want {
			t.Fatalf("decoded %+v, want %+v", a, want)
		}
		if unsafe.StringData(a.Device) != unsafe.StringData(key) {
			t.Errorf("record %d: the device's name is a copy of its key", i)
		}
		got = append(got, a)
	}
	for _, a := range got[1:] {
		for _, f := range []struct{ name, a, b string }{
			{"relay id", a.RelayID, got[0].RelayID},
			{"protocol", a.Protocol, got[0].Protocol},
			{"standby", a.Standby, got[0].Standby},
		} {
			if unsafe.StringData(f.a) != unsafe.StringData(f.b) {
				t.Errorf("%s of %s is a copy of %s's", f.name, a.Device, got[0].Device)
			}
		}
	}

	// A device whose name is not its key as is keeps its decoded name.
	odd := Attachment{Device: "a b", RelayID: "relay-a"}
	data, _ := json.Marshal(odd)
	if a, err := decodeAttachment(deviceKey(odd.Device), data); err != nil || a.Device != "a b" {
		t.Errorf("decoded %+v, %v; want device %q", a, err, odd.Device)
	}
	if _, err := decodeAttachment("dev", []byte(`{"device":`)); err == nil {
		t.Error("a truncated record decoded without an error")
	}
}
