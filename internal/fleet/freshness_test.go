package fleet

import (
	"testing"
	"time"
)

// TestViewFreshness judges peers' heartbeats in a relay's view of the fleet:
// by the clock while the relay's own beats come back through its mirror, at
// the moment its next beat was due once they stop (NATS away, quorum lost, a
// watch that delivers nothing).
func TestViewFreshness(t *testing.T) {
	const (
		interval = 2 * time.Second
		window   = 6 * time.Second
	)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tests := []struct {
		name      string
		now       time.Time
		own       time.Time // this relay's last beat in the mirror
		haveOwn   bool
		peer      time.Time // the peer's last beat in the mirror
		wantAge   time.Duration
		wantFresh bool
	}{
		{"current view, peer beating", at(10 * time.Second), at(9 * time.Second), true, at(9500 * time.Millisecond), 500 * time.Millisecond, true},
		{"current view, peer silent past the window", at(10 * time.Second), at(9 * time.Second), true, at(3 * time.Second), 7 * time.Second, false},
		{"own beat exactly due", at(10 * time.Second), at(8 * time.Second), true, at(4 * time.Second), 6 * time.Second, true},
		{"frozen 60 s, peer beat with us", at(70 * time.Second), at(10 * time.Second), true, at(9800 * time.Millisecond), 2200 * time.Millisecond, true},
		{"frozen 60 s, peer already stale when it froze", at(70 * time.Second), at(10 * time.Second), true, at(5 * time.Second), 7 * time.Second, false},
		{"frozen 20 min: nobody ages", at(20 * time.Minute), at(10 * time.Second), true, at(10 * time.Second), interval, true},
		{"peer beat after our last beat (mirror resynced before our beat)", at(70 * time.Second), at(10 * time.Second), true, at(69 * time.Second), -57 * time.Second, true},
		{"no own record: the clock", at(70 * time.Second), time.Time{}, false, at(10 * time.Second), 60 * time.Second, false},
		{"own record ahead of the clock", at(10 * time.Second), at(11 * time.Second), true, at(9 * time.Second), time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := view{at: viewAt(tt.now, tt.own, tt.haveOwn, interval), window: window}
			if got := v.age(tt.peer); got != tt.wantAge {
				t.Errorf("age %s, want %s", got, tt.wantAge)
			}
			if got := v.fresh(tt.peer); got != tt.wantFresh {
				t.Errorf("fresh %v, want %v", got, tt.wantFresh)
			}
		})
	}
}
