//go:build !race

package mux

import (
	"syscall"
	"unsafe"
)

// sysRead and sysWrite are read(2) and write(2) on a socket in
// non-blocking mode (every socket of the net package is), which never
// wait: they skip the runtime's bookkeeping of a system call that may
// block. That bookkeeping wakes the runtime's monitor thread whenever it
// sleeps because the process was idle, which a relay or an agent between
// two messages of a quiet connection is: a futex wake and a context
// switch per message, for a call that returns in microseconds. The race
// detector's build uses the syscall package's (see sys_race_linux.go).
func sysRead(fd int, p []byte) (int, error) {
	return rawIO(syscall.SYS_READ, fd, p)
}

func sysWrite(fd int, p []byte) (int, error) {
	return rawIO(syscall.SYS_WRITE, fd, p)
}

func rawIO(trap uintptr, fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, e := syscall.RawSyscall(trap, uintptr(fd), uintptr(ptr), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

func sysWritev(fd int, iov []syscall.Iovec) (int, error) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}
