package hugepages

import "golang.org/x/sys/unix"

func advise(addr, n uintptr) {
	// Errors are ignored: the advice is an optimization (EINVAL where the
	// kernel has no THP).
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, addr, n, unix.MADV_HUGEPAGE)
}
