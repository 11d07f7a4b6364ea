// Package testkit holds what tests of several packages share and that
// depends on no other Switchboard package, so that any package's tests may
// import it.
package testkit

import (
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
