package service

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Service
		err  string
	}{
		{in: "web=http://127.0.0.1:3000", want: Service{Name: "web", Kind: HTTP, Addr: "127.0.0.1:3000"}},
		{in: "web=http://localhost", want: Service{Name: "web", Kind: HTTP, Addr: "localhost:80"}},
		{in: "api=https://api.local/v1/", want: Service{Name: "api", Kind: HTTP, Addr: "api.local:443", TLS: true, ServerName: "api.local", Path: "/v1"}},
		{in: "grpc=h2c://127.0.0.1:50051", want: Service{Name: "grpc", Kind: HTTP, Addr: "127.0.0.1:50051", H2C: true}},
		{in: "ssh=tcp://127.0.0.1:22", want: Service{Name: "ssh", Kind: TCP, Addr: "127.0.0.1:22"}},
		{in: "db=tls://db.local:5432", want: Service{Name: "db", Kind: TCP, Addr: "db.local:5432", TLS: true, ServerName: "db.local"}},
		{in: "voice=udp://[::1]:24454", want: Service{Name: "voice", Kind: UDP, Addr: "[::1]:24454"}},
		{in: "ssh", err: "want NAME=URL"},
		{in: "SSH=tcp://h:22", err: "lowercase"},
		{in: "a--b=tcp://h:22", err: "single hyphens"},
		{in: "-a=tcp://h:22", err: "single hyphens"},
		{in: strings.Repeat("a", 64) + "=tcp://h:22", err: "1 to 63"},
		{in: "ssh=tcp://h", err: "needs a port"},
		{in: "ssh=ftp://h:21", err: "scheme must be"},
		{in: "ssh=tcp://h:22/x", err: "has no path"},
		{in: "ssh=tcp://u:p@h:22", err: "must look like"},
		{in: "web=http://h:1/?q=1", err: "must look like"},
		{in: "web=http:///x", err: "must look like"},
	} {
		got, err := Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestAnnounceRoundTrip(t *testing.T) {
	var services []Service
	for _, s := range []string{"http=http://127.0.0.1:3000/base", "grpc=h2c://127.0.0.1:50051", "ssh=tcp://127.0.0.1:22", "voice=udp://127.0.0.1:9"} {
		sv, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		services = append(services, sv)
	}
	services[0].Broadcast = []string{"/cam.mjpeg"}
	services[2].Passthrough = true
	v, err := Announce(services, false)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(v, "127.0.0.1:22") || strings.Contains(v, "127.0.0.1:9\"") {
		t.Errorf("the announcement names a raw service's address: %s", v)
	}
	got, err := ParseAnnouncement(v)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Announced{
		"http":  {Name: "http", Kind: HTTP, Path: "/base", Host: "127.0.0.1:3000", Broadcast: []string{"/cam.mjpeg"}},
		"grpc":  {Name: "grpc", Kind: HTTP, H2C: true, Host: "127.0.0.1:50051"},
		"ssh":   {Name: "ssh", Kind: TCP, Passthrough: true},
		"voice": {Name: "voice", Kind: UDP},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for name, a := range want {
		if !reflect.DeepEqual(got[name], a) {
			t.Errorf("%s: got %+v, want %+v", name, got[name], a)
		}
	}
	// With the user's Host kept, none is announced.
	v, _ = Announce(services[:1], true)
	if got, _ := ParseAnnouncement(v); got["http"].Host != "" {
		t.Errorf("preserved host announced as %q", got["http"].Host)
	}
}

func TestParseAnnouncementRejects(t *testing.T) {
	for _, v := range []string{
		``, `{}`, `[{"name":"x"}]`, `[{"name":"x","kind":"smtp"}]`,
		`[{"name":"a","kind":"tcp"},{"name":"a","kind":"tcp"}]`,
		`[{"name":"a","kind":"tcp","path":"/x"}]`,
		`[{"name":"a","kind":"http","path":"x"}]`,
		`[{"name":"a","kind":"http","host":"h/x"}]`,
		`[{"name":"A","kind":"http"}]`,
		`[{"name":"a","kind":"tcp","broadcast":["/x"]}]`,
		`[{"name":"a","kind":"http","broadcast":["x"]}]`,
		`[{"name":"a","kind":"http","broadcast":["/x?y"]}]`,
		`[{"name":"a","kind":"udp","passthrough":true}]`,
		`[{"name":"a","kind":"http","passthrough":true}]`,
		"[" + strings.Repeat(`{"name":"a","kind":"tcp"},`, 400) + `{"name":"b","kind":"tcp"}]`,
	} {
		if _, err := ParseAnnouncement(v); err == nil {
			t.Errorf("ParseAnnouncement(%.60q) accepted it", v)
		}
	}
}

func FuzzParseAnnouncement(f *testing.F) {
	f.Add(`[{"name":"http","kind":"http","path":"/base","host":"127.0.0.1:3000"},{"name":"ssh","kind":"tcp"}]`)
	f.Add(`[{"name":"grpc","kind":"http","h2c":true}]`)
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseAnnouncement(v)
		if err != nil {
			return
		}
		// What it accepts, Announce encodes again to the same.
		var list []Service
		for _, a := range got {
			list = append(list, Service{Name: a.Name, Kind: a.Kind, H2C: a.H2C, Path: a.Path, Addr: a.Host, Broadcast: a.Broadcast})
		}
		hostKept := true
		for _, a := range got {
			if a.Host != "" {
				hostKept = false
			}
		}
		if hostKept {
			again, err := Announce(list, true)
			if err != nil {
				t.Fatalf("accepted %q, but its re-encoding fails: %v", v, err)
			}
			back, err := ParseAnnouncement(again)
			if err != nil || len(back) != len(got) {
				t.Fatalf("re-encoded %q does not decode the same: %v", again, err)
			}
		}
	})
}

// Agents that announce the same services share one parsed map.
func TestParseAnnouncementShares(t *testing.T) {
	v, err := Announce([]Service{{Name: Default, Kind: HTTP, Addr: "127.0.0.1:8080"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ParseAnnouncement(v)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseAnnouncement(v)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.ValueOf(a).UnsafePointer() != reflect.ValueOf(b).UnsafePointer() {
		t.Error("two parses of one announcement made two maps")
	}
	if _, err := ParseAnnouncement(`[{"name":"x y","kind":"http"}]`); err == nil {
		t.Error("a bad announcement parsed")
	}
	if _, err := ParseAnnouncement(`[{"name":"x y","kind":"http"}]`); err == nil {
		t.Error("a bad announcement parsed the second time")
	}
}
