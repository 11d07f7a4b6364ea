package mux

import (
	"sync"
	"syscall"
)

// An idle session holds no goroutine: when its reader finds the socket
// empty (holding no buffer, see rawReader) and the session idle, the
// socket is registered with one epoll instance of the process's, and the
// reader's goroutine returns. One goroutine, the poller, waits on that
// instance for all the sessions parked so, and starts a session's reader
// again, in a fresh goroutine, once its socket is readable or hung up.
// The poller starts with the first parked session and returns when none
// is left.
//
// An event names a park by a number that is never used again, looked up
// in parking.parked: an event for a session that has ended since, or for
// a descriptor number that was closed and reused, finds nothing and is
// dropped. Registrations are one-shot: a socket's event disables it until
// its reader parks again.
var parking = parker{epfd: -1}

type parker struct {
	mu      sync.Mutex
	epfd    int                 // -1 until made
	wake    [2]int              // a pipe that wakes the poller to see that nothing is parked
	err     error               // why there is no epoll instance: sessions wait as before
	parked  map[uint64]*Session // by park number; nil while none
	next    uint64              // the number of the next park; 0 is the pipe's
	running bool                // the poller runs
}

// park registers the session's socket and reports whether it did: the
// reader's goroutine then returns, and the poller starts it again. It is
// called by the reader, holding no buffer, after a read found nothing.
func (s *Session) park() bool {
	r := s.raw
	ok := false
	err := r.raw.Control(func(fd uintptr) {
		p := &parking
		p.mu.Lock()
		defer p.mu.Unlock()
		if r.closed || !p.ready() {
			return
		}
		p.next++
		id := p.next
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT}
		ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
		op := syscall.EPOLL_CTL_ADD
		if r.registered { // disabled by its last event, not removed
			op = syscall.EPOLL_CTL_MOD
		}
		err := syscall.EpollCtl(p.epfd, op, int(fd), &ev)
		switch {
		case err == syscall.ENOENT && op == syscall.EPOLL_CTL_MOD:
			err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
		case err == syscall.EEXIST && op == syscall.EPOLL_CTL_ADD:
			err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_MOD, int(fd), &ev)
		}
		if err != nil {
			return
		}
		// The poller may see the event as soon as the lock is let go: the
		// reader's fields are set before, and not touched after.
		r.registered, r.parkID = true, id
		if p.parked == nil {
			p.parked = map[uint64]*Session{}
		}
		p.parked[id] = s
		if !p.running {
			p.running = true
			go p.poll()
		}
		ok = true
	})
	return err == nil && ok
}

// unpark is called as the session ends, before its socket is closed: no
// park is made after it, and one made before is removed. It reports
// whether the session was parked, its reader then ending with it.
func (s *Session) unpark() bool {
	r := s.raw
	if r == nil {
		return false
	}
	p := &parking
	p.mu.Lock()
	r.closed = true
	_, parked := p.parked[r.parkID]
	if parked {
		delete(p.parked, r.parkID)
		if len(p.parked) == 0 {
			p.parked = nil
			p.signal() // the poller returns
		}
	}
	p.mu.Unlock()
	if parked {
		// The socket is still open (it is closed after this), so the
		// number names it; an event already taken finds nothing parked.
		r.raw.Control(func(fd uintptr) {
			syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
		})
	}
	return parked
}

// ready makes the epoll instance, and the pipe that wakes its poller,
// if there are none, and reports whether there are. Called holding mu.
func (p *parker) ready() bool {
	if p.err != nil {
		return false
	}
	if p.epfd >= 0 {
		return true
	}
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		p.err = err
		return false
	}
	if err = syscall.Pipe2(p.wake[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err == nil {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN} // number 0
		if err = syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, p.wake[0], &ev); err != nil {
			syscall.Close(p.wake[0])
			syscall.Close(p.wake[1])
		}
	}
	if err != nil {
		syscall.Close(epfd)
		p.err = err
		return false
	}
	p.epfd = epfd
	return true
}

// signal wakes the poller. Called holding mu.
func (p *parker) signal() {
	if p.running {
		syscall.Write(p.wake[1], []byte{1}) // a full pipe wakes it as well
	}
}

// poll waits for the parked sessions' sockets and starts the reader of
// each that is readable, until none is parked.
func (p *parker) poll() {
	var events [128]syscall.EpollEvent
	var woken []*Session
	var drain [64]byte
	for {
		n, err := syscall.EpollWait(p.epfd, events[:], -1)
		if err == syscall.EINTR {
			continue
		}
		p.mu.Lock()
		if err != nil {
			// Not to happen: wake every session, and let them wait as
			// before from now on.
			p.err = err
			for id, s := range p.parked {
				woken = append(woken, s)
				delete(p.parked, id)
			}
		}
		for _, ev := range events[:max(n, 0)] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if id == 0 {
				for {
					if n, _ := syscall.Read(p.wake[0], drain[:]); n < len(drain) {
						break
					}
				}
				continue
			}
			if s, ok := p.parked[id]; ok {
				delete(p.parked, id)
				woken = append(woken, s)
			}
		}
		done := len(p.parked) == 0
		if done {
			p.parked = nil
			p.running = false
		}
		p.mu.Unlock()
		for i, s := range woken {
			go s.readLoop()
			woken[i] = nil
		}
		woken = woken[:0]
		if done {
			return
		}
	}
}
