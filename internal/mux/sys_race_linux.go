//go:build race

package mux

import (
	"syscall"
	"unsafe"
)

// Under the race detector the syscall package's calls stand in for
// sys_norace_linux.go's, for their annotations: the detector sees an
// order between what one goroutine writes to a socket and what another
// reads from it.
func sysRead(fd int, p []byte) (int, error) { return syscall.Read(fd, p) }

func sysWrite(fd int, p []byte) (int, error) { return syscall.Write(fd, p) }

func sysWritev(fd int, iov []syscall.Iovec) (int, error) {
	n, _, e := syscall.Syscall(syscall.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}
