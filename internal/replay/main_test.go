package replay

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: the
// bare HTTP/2 peers and the clients the wording tests start.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
