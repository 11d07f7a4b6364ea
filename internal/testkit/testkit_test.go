package testkit

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestEventuallyReturnsOnceTheCheckHolds(t *testing.T) {
	calls := 0
	Eventually(t, 5*time.Second, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Fatalf("check called %d times, want 3", calls)
	}
}

// fatalTB records a Fatalf and stops the calling function, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

type stopped struct{}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(stopped{})
}

func TestEventuallyFailsWithTheLastError(t *testing.T) {
	tb := &fatalTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != (stopped{}) {
				panic(r)
			}
		}()
		Eventually(tb, 20*time.Millisecond, func() error { return errors.New("still down") })
	}()
	if !strings.Contains(tb.msg, "still down") || !strings.Contains(tb.msg, "20ms") {
		t.Fatalf("Fatalf message %q: want the deadline and the last error", tb.msg)
	}
}
