package lograte

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	l := New(3).WithClock(func() time.Time { return now })
	for range 100 {
		l.InfoTo(log, "refused")
	}
	if n := strings.Count(buf.String(), "refused"); n != 3 {
		t.Fatalf("%d lines in one second, want 3:\n%s", n, buf.String())
	}
	buf.Reset()
	now = now.Add(time.Second)
	l.WarnTo(log, "refused")
	if !strings.Contains(buf.String(), "suppressed=97") || !strings.Contains(buf.String(), "level=WARN") {
		t.Fatalf("the next second's line does not count those held back: %s", buf.String())
	}
}

// A logger that drops the level costs nothing and holds nothing back.
func TestDisabledLevel(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	l := New(1)
	l.InfoTo(log, "refused")
	l.WarnTo(log, "warned")
	if !strings.Contains(buf.String(), "warned") || strings.Contains(buf.String(), "suppressed") {
		t.Fatalf("got %q", buf.String())
	}
}
