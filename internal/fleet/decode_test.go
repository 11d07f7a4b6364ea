package fleet

import (
	"encoding/json"
	"fmt"
	"runtime"
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

// BenchmarkDirectoryRecordHeap reports the heap a relay's mirror of the
// directory keeps per record, decoded as plain JSON and as the mirror
// decodes it: go test ./internal/fleet -run - -bench DirectoryRecordHeap.
func BenchmarkDirectoryRecordHeap(b *testing.B) {
	const records = 100_000
	plain := func(_ string, data []byte) (Attachment, error) {
		var a Attachment
		err := json.Unmarshal(data, &a)
		return a, err
	}
	for _, d := range []struct {
		name   string
		decode func(string, []byte) (Attachment, error)
	}{{"json", plain}, {"mirror", decodeAttachment}} {
		b.Run(d.name, func(b *testing.B) {
			at := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
			var perRecord uint64
			for b.Loop() {
				var ms runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms)
				before := ms.HeapAlloc
				items := make(map[string]Attachment)
				for i := range records {
					a := Attachment{Device: fmt.Sprintf("robot-%06d", i), RelayID: "relay-3f9c2a1b7e", AttachedAt: at,
						Agents: 1, Protocol: "native", UpdatedAt: at, Standby: "relay-8d1e44c0aa"}
					data, err := json.Marshal(a)
					if err != nil {
						b.Fatal(err)
					}
					key := deviceKey(a.Device)
					if items[key], err = d.decode(key, data); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&ms)
				perRecord = (ms.HeapAlloc - before) / records
				runtime.KeepAlive(items)
			}
			b.ReportMetric(float64(perRecord), "heap-B/record")
		})
	}
}
