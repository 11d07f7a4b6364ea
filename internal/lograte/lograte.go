// Package lograte bounds how often a hot path logs: a flood of refused
// connections or datagrams, which costs its sender nothing, must not turn
// into a flood of log lines. A Limiter lets a few lines a second through
// and counts the others; the next line it lets through says how many it
// held back.
//
//	refusals := lograte.New(lograte.DefaultPerSecond)
//	...
//	refusals.InfoTo(log, "connection refused", logkey.Source, src)
package lograte

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// DefaultPerSecond is how many lines a second a limiter lets through when
// none is said: enough to see who is refused, too few to fill a disk.
const DefaultPerSecond = 10

// Limiter lets at most its bound of lines a second through. The zero
// value is not usable: make one with New.
type Limiter struct {
	per int
	now func() time.Time

	mu      sync.Mutex // guards the fields below
	window  time.Time  // the second lines are counted in
	in      int        // lines let through in window
	skipped int        // lines held back since the last one let through
}

// New returns a limiter of perSecond lines a second (DefaultPerSecond if
// zero or less).
func New(perSecond int) *Limiter {
	return &Limiter{per: cmp.Or(max(perSecond, 0), DefaultPerSecond), now: time.Now}
}

// WithClock returns l reading the time from now, for tests.
func (l *Limiter) WithClock(now func() time.Time) *Limiter {
	l.now = now
	return l
}

// Allow reports whether a line may be logged now and, when it may, how
// many were held back before it.
func (l *Limiter) Allow() (skipped int, ok bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.window) >= time.Second {
		l.window, l.in = now, 0
	}
	if l.in >= l.per {
		l.skipped++
		return 0, false
	}
	l.in++
	skipped, l.skipped = l.skipped, 0
	return skipped, true
}

// InfoTo logs msg to log at level Info unless this second's lines are
// spent; a line after some were held back carries their count
// (logkey.Suppressed).
func (l *Limiter) InfoTo(log *slog.Logger, msg string, args ...any) {
	l.log(log, slog.LevelInfo, msg, args...)
}

// WarnTo is InfoTo at level Warn.
func (l *Limiter) WarnTo(log *slog.Logger, msg string, args ...any) {
	l.log(log, slog.LevelWarn, msg, args...)
}

func (l *Limiter) log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	if !log.Enabled(context.Background(), level) {
		return
	}
	skipped, ok := l.Allow()
	if !ok {
		return
	}
	if skipped > 0 {
		args = append(args, logkey.Suppressed, skipped)
	}
	log.Log(context.Background(), level, msg, args...)
}
