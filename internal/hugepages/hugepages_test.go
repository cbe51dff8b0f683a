package hugepages

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestAdviseMarksOnlyWholeHugePagesInside: the advised range is the huge
// pages inside the slice (the kernel shows it as its own mapping with
// "hg" among its VmFlags), and what the slice holds is unchanged.
func TestAdviseMarksOnlyWholeHugePagesInside(t *testing.T) {
	if _, err := os.Stat("/proc/self/smaps"); err != nil {
		t.Skip("no /proc/self/smaps here (Linux has it):", err)
	}
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(b), "[never]") {
		t.Skip("transparent huge pages are off here:", string(b), err)
	}
	s := make([]uint64, 5*Size/8)
	Advise(s)
	for i := range s {
		s[i] = uint64(i)
	}
	start := uintptr(unsafe.Pointer(&s[0]))
	beg := (start + Size - 1) &^ (Size - 1)
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var inRange, flagged bool
	for _, line := range strings.Split(string(smaps), "\n") {
		if lo, hi, ok := mapping(line); ok {
			inRange = lo <= beg && beg < hi
			continue
		}
		if inRange && strings.HasPrefix(line, "VmFlags:") {
			flagged = strings.Contains(line, " hg")
			break
		}
	}
	if !flagged {
		t.Fatalf("the mapping holding %#x is not advised for huge pages", beg)
	}
	for i := range s {
		if s[i] != uint64(i) {
			t.Fatalf("element %d is %d after the advice", i, s[i])
		}
	}
	Advise([]byte(nil))        // nothing to advise
	Advise(make([]byte, Size)) // too small to hold a whole huge page surely: left alone
}

// mapping parses the address range of a mapping's first line in smaps
// ("7f0c...-7f0d... rw-p ...").
func mapping(line string) (lo, hi uintptr, ok bool) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, 0, false
	}
	a, b, found := strings.Cut(f[0], "-")
	if !found {
		return 0, 0, false
	}
	l, err1 := strconv.ParseUint(a, 16, 64)
	h, err2 := strconv.ParseUint(b, 16, 64)
	return uintptr(l), uintptr(h), err1 == nil && err2 == nil
}
