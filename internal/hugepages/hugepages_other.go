//go:build !linux

package hugepages

func advise(addr, n uintptr) {}
