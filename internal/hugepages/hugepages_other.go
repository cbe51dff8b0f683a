//go:build !linux

package hugepages

func madviseMode() bool            { return false }
func adviseHuge(addr, n uintptr)   {}
func adviseNoHuge(addr, n uintptr) {}
