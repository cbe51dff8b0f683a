package hugepages

import (
	"bytes"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// madviseMode reports whether the kernel gives huge pages only to memory
// advised so.
var madviseMode = sync.OnceValue(func() bool {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	return err == nil && bytes.Contains(b, []byte("[madvise]"))
})

// Errors are ignored: the advice is an optimization.
func adviseHuge(addr, n uintptr) {
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, addr, n, unix.MADV_HUGEPAGE)
}

func adviseNoHuge(addr, n uintptr) {
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, addr, n, unix.MADV_NOHUGEPAGE)
}
