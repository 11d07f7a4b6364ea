package tcpconns

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/lograte"
)

func TestWaitAndCut(t *testing.T) {
	tr := New(Config{})
	if err := tr.Wait(context.Background()); err != nil {
		t.Fatalf("wait with none open: %v", err)
	}
	cut := 0
	a := tr.Open(Port, "6379", "robot/redis", "192.0.2.1:1", func() { cut++ })
	b := tr.Open(Connect, "ssh", "robot/ssh", "192.0.2.2:2", func() { cut++ })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := tr.Wait(ctx); err == nil {
		t.Fatal("wait returned with two open")
	}
	a.Close(1, 2)
	if n := tr.Cut(); n != 1 || cut != 1 {
		t.Fatalf("cut %d (%d calls), want 1", n, cut)
	}
	if n := tr.Cut(); n != 0 {
		t.Fatalf("a second cut cut %d again", n)
	}
	b.Close(0, 0)
	if err := tr.Wait(context.Background()); err != nil || tr.Count() != 0 {
		t.Fatalf("wait after the last closed: %v, %d open", err, tr.Count())
	}
}

func TestServiceNamesBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	tr := New(Config{Registry: reg})
	for i := range MaxServiceNames + 10 {
		tr.Open(Connect, "svc"+strconv.Itoa(i), "d/x", "s", nil).Close(1, 1)
		tr.Refuse(Connect, "", "d/typed"+strconv.Itoa(i), "s", ReasonUnknownService, nil)
	}
	if n := count(t, reg, "switchboard_tcp_connections_total"); n != MaxServiceNames+1 {
		t.Errorf("%d label sets, want %d and %s", n, MaxServiceNames, OtherName)
	}
	if n := count(t, reg, "switchboard_tcp_refusals_total"); n != 1 {
		t.Errorf("refusals of typed names: %d label sets, want 1", n)
	}
}

func TestEventsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	var got []Event
	tr := New(Config{EventsPerSecond: 2, Now: func() time.Time { return now }, Record: func(e Event) { got = append(got, e) }})
	for range 5 {
		tr.Open(Port, "22", "robot/ssh", "192.0.2.1:5", nil)
	}
	if len(got) != 2 {
		t.Fatalf("%d events in one second, want 2", len(got))
	}
	now = now.Add(time.Second)
	tr.Open(Port, "22", "robot/ssh", "192.0.2.1:6", nil)
	if len(got) != 3 || !strings.Contains(got[2].Message, "3 connection events not recorded") || got[2].Device != "robot" {
		t.Fatalf("the next second's event: %+v", got[len(got)-1])
	}
	if !strings.Contains(got[0].Message, "192.0.2.1:5") {
		t.Errorf("the event does not name the user's address: %q", got[0].Message)
	}
}

// count returns how many label sets the metric name has in reg.
func count(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// A service name the device turns out not to have (the refusal comes once
// the connection is used) gives its label back.
func TestTypedNameUnlabelled(t *testing.T) {
	reg := prometheus.NewRegistry()
	tr := New(Config{Registry: reg})
	tr.Open(Connect, "typed-by-a-user", "d/typed-by-a-user", "s", nil).Refused(ReasonUnknownService, nil)
	tr.Open(Connect, "ssh", "d/ssh", "s", nil).Close(1, 1)
	tr.Open(Connect, "ssh", "d/ssh", "s", nil).Refused(ReasonUnknownService, nil) // another device
	if n := count(t, reg, "switchboard_tcp_connections_total"); n != 1 {
		t.Errorf("%d label sets of connections, want ssh alone", n)
	}
	if n := count(t, reg, "switchboard_tcp_refusals_total"); n != 2 {
		t.Errorf("%d label sets of refusals, want _other and ssh", n)
	}
	if len(tr.names) != 1 {
		t.Errorf("names kept: %v", tr.names)
	}
	// Two at once to a typed name: the label goes with the last.
	a := tr.Open(Connect, "typed2", "d/typed2", "s", nil)
	b := tr.Open(Connect, "typed2", "d/typed2", "s", nil)
	a.Refused(ReasonUnknownService, nil)
	b.Refused(ReasonUnknownService, nil)
	if n := count(t, reg, "switchboard_tcp_connections_open"); n != 1 {
		t.Errorf("%d label sets of open connections, want ssh alone", n)
	}
	if len(tr.names) != 1 {
		t.Errorf("names kept: %v", tr.names)
	}
}

// UDP flows and passthroughs are counted apart from TCP connections, each
// kind's typed names bounded on its own, and logged as what they are.
func TestKinds(t *testing.T) {
	reg := prometheus.NewRegistry()
	var buf bytes.Buffer
	tr := New(Config{Registry: reg, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	for i := range MaxServiceNames {
		tr.Open(Connect, "svc"+strconv.Itoa(i), "d/x", "s", nil).Close(1, 1)
	}
	tr.Open(ConnectUDP, "voice", "d/voice", "192.0.2.1:5", nil).Close(3, 4)
	tr.Open(PortUDP, "53", "d/dns", "192.0.2.1:6", nil).Close(1, 1)
	tr.Open(Passthrough, "web", "d/web", "192.0.2.1:7", nil).Close(5, 6)
	for _, want := range []string{
		`kind=connect_udp name=voice`, `kind=port_udp name=53`, `kind=passthrough name=web`,
	} {
		if n := countLabels(t, reg, "switchboard_tcp_connections_total", want); n != 1 {
			t.Errorf("%s: %d label sets, want 1", want, n)
		}
	}
	for _, want := range []string{"msg=\"udp flow opened\"", "msg=\"udp flow closed\"", "msg=\"passthrough opened\"", "source=192.0.2.1:7"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("no %s in the log:\n%s", want, buf.String())
		}
	}
}

// countLabels counts the label sets of the metric name in reg whose
// labels, written "k=v k=v" in their order, are want.
func countLabels(t *testing.T, reg *prometheus.Registry, name, want string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			if strings.Join(ls, " ") == want {
				n++
			}
		}
	}
	return n
}

// A flood of refusals, which costs its sender nothing, logs a few lines a
// second; the next line let through counts those held back, and the
// metrics count every one.
func TestRefusalLinesBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	tr := New(Config{Registry: reg, Logger: slog.New(slog.NewTextHandler(&buf, nil)), Now: func() time.Time { return now }})
	for range 1000 {
		tr.Refuse(Port, "6379", "d/redis", "192.0.2.9:1", ReasonSource, nil)
	}
	if n := strings.Count(buf.String(), "tcp connection refused"); n != lograte.DefaultPerSecond {
		t.Fatalf("%d refusal lines in one second, want %d", n, lograte.DefaultPerSecond)
	}
	buf.Reset()
	now = now.Add(time.Second)
	tr.Open(Port, "6379", "d/redis", "192.0.2.9:2", nil).Refused(ReasonRefused, nil)
	if want := fmt.Sprintf("suppressed=%d", 1000-lograte.DefaultPerSecond); !strings.Contains(buf.String(), want) {
		t.Errorf("no %s in the next second's line:\n%s", want, buf.String())
	}
	if n := counterValue(t, reg, "switchboard_tcp_refusals_total", "kind=port name=6379 reason=source_not_allowed"); n != 1000 {
		t.Errorf("%v refusals counted, want 1000", n)
	}
}

// counterValue is the value of the counter name in reg whose labels are
// want, written as for countLabels.
func counterValue(t *testing.T, reg *prometheus.Registry, name, want string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			if strings.Join(ls, " ") == want {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
