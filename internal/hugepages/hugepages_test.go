package hugepages

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestAdviseThenDone: the advised range is the huge pages inside the
// slice (the kernel shows it as its own mapping, "hg" among its VmFlags);
// Done turns it to "nh" (khugepaged leaves it alone); what the slice holds
// is unchanged. Run where THP is in "madvise" mode (elsewhere nothing is
// advised, by design).
func TestAdviseThenDone(t *testing.T) {
	if _, err := os.Stat("/proc/self/smaps"); err != nil {
		t.Skip("no /proc/self/smaps here (Linux has it):", err)
	}
	if !madviseMode() {
		t.Skip("transparent huge pages are not in madvise mode here: Advise does nothing")
	}
	s := make([]uint64, 5*Size/8)
	r := Advise(s)
	start := uintptr(unsafe.Pointer(&s[0]))
	beg := (start + Size - 1) &^ (Size - 1)
	if r.addr != beg || r.n < 4*Size || r.addr+r.n > start+5*Size {
		t.Fatalf("advised [%#x, +%#x) for a slice at %#x of 5 huge pages", r.addr, r.n, start)
	}
	for i := range s {
		s[i] = uint64(i)
	}
	if f := vmFlags(t, beg); !strings.Contains(f, " hg") {
		t.Fatalf("the mapping holding %#x is not advised for huge pages: %s", beg, f)
	}
	r.Done()
	if f := vmFlags(t, beg); strings.Contains(f, " hg") || !strings.Contains(f, " nh") {
		t.Fatalf("after Done the mapping holding %#x is still advised: %s", beg, f)
	}
	for i := range s {
		if s[i] != uint64(i) {
			t.Fatalf("element %d is %d after the advice", i, s[i])
		}
	}
	if r := Advise([]byte(nil)); r.n != 0 {
		t.Fatal("advised an empty slice")
	}
	if r := Advise(make([]byte, Size)); r.n != 0 {
		t.Fatal("advised a slice that may hold no whole huge page")
	}
	Region{}.Done() // nothing to undo
}

// vmFlags is the VmFlags line of the mapping holding addr.
func vmFlags(t *testing.T, addr uintptr) string {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	inRange := false
	for _, line := range strings.Split(string(smaps), "\n") {
		if lo, hi, ok := mapping(line); ok {
			inRange = lo <= addr && addr < hi
			continue
		}
		if inRange && strings.HasPrefix(line, "VmFlags:") {
			return line
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return ""
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
