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

// TestThawedView: once this relay's beats come back after a freeze, a peer
// whose last beat came before the freeze is not aged by the freeze, nor for
// ThawGrace after it: fresh for the grace and one window after the thaw,
// stale after them if it has not beaten again;
// silences that began after the freeze count in full.
func TestThawedView(t *testing.T) {
	const (
		interval = 2 * time.Second
		window   = 6 * time.Second
	)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// Own beats at 10 s, then none until 70 s: frozen from 12 s to 70 s.
	f := thawed(at(10*time.Second), at(70*time.Second), interval)
	if f == nil || !f.from.Equal(at(12*time.Second)) || !f.to.Equal(at(70*time.Second)) {
		t.Fatalf("thawed = %+v, want a freeze from 12 s to 70 s", f)
	}
	for _, gap := range []time.Duration{interval, interval + 300*time.Millisecond, 2 * interval} {
		if f := thawed(at(10*time.Second), at(10*time.Second).Add(gap), interval); f != nil {
			t.Errorf("a beat %s after the last one is no freeze, got %+v", gap, f)
		}
	}
	tests := []struct {
		name      string
		now       time.Time
		peer      time.Time
		wantAge   time.Duration
		wantFresh bool
	}{
		{"at the thaw, peer beat just before the freeze", at(70 * time.Second), at(11 * time.Second), time.Second, true},
		{"within the grace after the thaw, no new beat yet", at(74 * time.Second), at(11 * time.Second), time.Second, true},
		{"more than a window after the thaw, but the grace comes first", at(78 * time.Second), at(11 * time.Second), 4 * time.Second, true},
		{"the grace and a window after the thaw, no new beat", at(81 * time.Second), at(11 * time.Second), 7 * time.Second, false},
		{"at the thaw, peer already stale when it froze", at(70 * time.Second), at(4 * time.Second), 8 * time.Second, false},
		{"peer beat after the thaw", at(72 * time.Second), at(71 * time.Second), time.Second, true},
		{"peer's last beat during the freeze counts in full", at(72 * time.Second), at(50 * time.Second), 22 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := view{at: viewAt(tt.now, tt.now, true, interval), window: window, frozen: f} // this relay beating again
			if got := v.age(tt.peer); got != tt.wantAge {
				t.Errorf("age %s, want %s", got, tt.wantAge)
			}
			if got := v.fresh(tt.peer); got != tt.wantFresh {
				t.Errorf("fresh %v, want %v", got, tt.wantFresh)
			}
		})
	}
}
