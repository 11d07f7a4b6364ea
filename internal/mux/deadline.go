package mux

import (
	"sync"
	"time"
)

// deadline is a settable point in time with a channel closed when it
// passes, for a blocked read or write to select on.
type deadline struct {
	mu      sync.Mutex // guards the fields below
	timer   *time.Timer
	expired chan struct{} // closed when the deadline passes; replaced by set
}

func newDeadline() deadline { return deadline{expired: make(chan struct{})} }

// set moves the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.expired // the timer fired: wait for it to close the channel
	}
	d.timer = nil
	closed := isClosed(d.expired)
	if t.IsZero() {
		if closed {
			d.expired = make(chan struct{})
		}
		return
	}
	if until := time.Until(t); until > 0 {
		if closed {
			d.expired = make(chan struct{})
		}
		ch := d.expired
		d.timer = time.AfterFunc(until, func() { close(ch) })
		return
	}
	if !closed {
		close(d.expired)
	}
}

// wait returns the channel closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.expired
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
