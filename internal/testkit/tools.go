package testkit

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Tool finds a program none of us wrote that a test runs (nginx, haproxy,
// sshd, ...): $SWITCHBOARD_<NAME> if set, else the PATH, else /usr/sbin
// (Debian's place for daemons, often not on a user's PATH). A missing
// program skips the test, unless the environment variable require is set
// (CI sets it), which makes it fail.
func Tool(tb testing.TB, name, require string) string {
	tb.Helper()
	if p := os.Getenv("SWITCHBOARD_" + strings.ToUpper(name)); p != "" {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := "/usr/sbin/" + name; fileExists(p) {
		return p
	}
	if os.Getenv(require) != "" {
		tb.Fatalf("%s is not installed (apt-get install it, or set SWITCHBOARD_%s), and %s asks for it", name, strings.ToUpper(name), require)
	}
	tb.Skipf("%s is not installed; set %s to make this a failure", name, require)
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// ServeTCP serves handle on a loopback port until the test ends, each
// connection in its own goroutine and closed when handle returns, and
// returns the port's address. The test's cleanup waits for every handler.
func ServeTCP(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	return ln.Addr().String()
}
