// Package testkit holds what tests of several packages share and that
// depends on no other Switchboard package, so that any package's tests may
// import it.
package testkit

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// Eventually calls check until it returns nil, failing the test with
// check's last error when within passes. It polls; it never sleeps blind.
func Eventually(tb testing.TB, within time.Duration, check func() error) {
	tb.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not true within %v: %v", within, err)
		}
		<-tick.C
	}
}

// Buffer collects what a logger or a process writes while the test reads
// it: a bytes.Buffer safe for concurrent use.
type Buffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Count returns how many times s was written so far.
func (b *Buffer) Count(s string) int { return strings.Count(b.String(), s) }

// Tail returns the last n lines written so far.
func (b *Buffer) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
