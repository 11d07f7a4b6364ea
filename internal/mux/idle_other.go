//go:build !linux

package mux

import "net"

// idleWaiter is Linux-only; elsewhere an idle session keeps its read
// buffer.
type idleWaiter struct{}

func newIdleWaiter(net.Conn) *idleWaiter { return nil }

func (*idleWaiter) wait() error { return nil }
