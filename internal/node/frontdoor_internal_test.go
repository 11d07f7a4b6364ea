package node

import (
	"fmt"
	"testing"
	"time"
)

// TestSendBacksDue: one ask per device per window, devices apart, and the
// memory bounded.
func TestSendBacksDue(t *testing.T) {
	var s sendBacks
	t0 := time.Unix(1000, 0)
	steps := []struct {
		device string
		at     time.Duration
		want   bool
	}{
		{"a", 0, true},
		{"a", time.Second, false},
		{"b", time.Second, true},
		{"a", sendBackEvery - time.Millisecond, false},
		{"a", sendBackEvery, true},
		{"b", sendBackEvery, false},
		{"b", sendBackEvery + time.Second, true},
	}
	for i, st := range steps {
		if got := s.due(st.device, t0.Add(st.at)); got != st.want {
			t.Errorf("step %d: due(%s, +%s) = %v, want %v", i, st.device, st.at, got, st.want)
		}
	}
	for i := range 3 * maxSendBacks {
		s.due(fmt.Sprint("d", i), t0.Add(sendBackEvery*3))
	}
	if n := len(s.last); n > maxSendBacks {
		t.Errorf("%d devices remembered, want at most %d", n, maxSendBacks)
	}
}
