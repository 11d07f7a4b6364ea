// Package backoff computes reconnect delays: a first retry almost at once,
// then full-jitter exponential growth to a cap, reset after a stable period.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy sets the delays. The zero value of a field means its default.
type Policy struct {
	// First caps the delay before the first retry after a success. Default 100 ms.
	First time.Duration
	// Base is the ceiling of the second retry's delay, doubling after each
	// further failure. Default 250 ms.
	Base time.Duration
	// Max caps every delay. Default 8 s.
	Max time.Duration
	// Stable is how long a connection must last for the next failure to count
	// as a first one again. Default 10 s.
	Stable time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.First <= 0 {
		p.First = 100 * time.Millisecond
	}
	if p.Base <= 0 {
		p.Base = 250 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 8 * time.Second
	}
	if p.Stable <= 0 {
		p.Stable = 10 * time.Second
	}
	return p
}

// Backoff tracks consecutive failures. It is not safe for concurrent use.
type Backoff struct {
	p        Policy
	failures int
	upSince  time.Time
}

// New returns a Backoff following p.
func New(p Policy) *Backoff { return &Backoff{p: p.withDefaults()} }

// Up records that a connection succeeded at now.
func (b *Backoff) Up(now time.Time) {
	if b.upSince.IsZero() {
		b.upSince = now
	}
}

// Next records a failure at now and returns how long to wait before retrying:
// uniform in [0, First) after a stable period, then uniform in
// [0, min(Max, Base·2^(n-2))) for the n-th consecutive failure.
func (b *Backoff) Next(now time.Time) time.Duration {
	if !b.upSince.IsZero() && now.Sub(b.upSince) >= b.p.Stable {
		b.failures = 0
	}
	b.upSince = time.Time{}
	b.failures++
	ceiling := b.p.First
	if b.failures > 1 {
		ceiling = b.p.Base
		for i := 2; i < b.failures && ceiling < b.p.Max; i++ {
			ceiling *= 2
		}
		ceiling = min(ceiling, b.p.Max)
	}
	return rand.N(ceiling)
}

// Failures returns the number of consecutive failures so far.
func (b *Backoff) Failures() int { return b.failures }
