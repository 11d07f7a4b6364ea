package backoff

import (
	"testing"
	"time"
)

func TestNextBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		failure int
		ceiling time.Duration
	}{
		{1, 100 * time.Millisecond},
		{2, 250 * time.Millisecond},
		{3, 500 * time.Millisecond},
		{4, time.Second},
		{7, 8 * time.Second},
		{12, 8 * time.Second},
	}
	for _, tt := range tests {
		for trial := 0; trial < 200; trial++ {
			b := New(Policy{})
			var d time.Duration
			for i := 0; i < tt.failure; i++ {
				d = b.Next(now)
			}
			if d < 0 || d >= tt.ceiling {
				t.Fatalf("failure %d: delay %v outside [0, %v)", tt.failure, d, tt.ceiling)
			}
		}
	}
}

func TestResetAfterStablePeriod(t *testing.T) {
	now := time.Unix(1000, 0)
	b := New(Policy{})
	for i := 0; i < 6; i++ {
		b.Next(now)
	}
	b.Up(now)
	b.Next(now.Add(time.Second)) // a short-lived connection does not reset
	if got := b.Failures(); got != 7 {
		t.Fatalf("failures after an unstable connection = %d, want 7", got)
	}
	b.Up(now.Add(2 * time.Second))
	if d := b.Next(now.Add(13 * time.Second)); d >= 100*time.Millisecond {
		t.Fatalf("first retry after a stable period took %v, want < 100ms", d)
	}
	if got := b.Failures(); got != 1 {
		t.Fatalf("failures after a stable connection = %d, want 1", got)
	}
}

func TestJitterSpreads(t *testing.T) {
	b := New(Policy{})
	seen := map[time.Duration]bool{}
	for i := 0; i < 50; i++ {
		b = New(Policy{})
		b.Next(time.Unix(0, 0))
		seen[b.Next(time.Unix(0, 0))] = true
	}
	if len(seen) < 10 {
		t.Fatalf("50 jittered delays took only %d distinct values", len(seen))
	}
}
