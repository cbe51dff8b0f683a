package journal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/catena-streams/catena/replica/partlog"
)

// ScanResult is what a scan found of the journal's end.
type ScanResult struct {
	// End is the position after the last valid group: where the journal
	// continues.
	End uint64
	// Torn is set when the last segment ended in bytes that are not a
	// valid group and no valid group follows them: what a crash during
	// a group's write leaves (the group was never acknowledged). A
	// segment whose creation a crash interrupted (header missing) counts
	// as torn too.
	Torn bool
	// Headerless is set when the last segment has no valid header: its
	// creation was cut short and it holds no group (Torn is set too).
	Headerless bool
	// Groups is how many groups were read.
	Groups int
}

type segmentFile struct {
	name string
	base uint64
}

// Scan reads the journal in dir and calls fn with every record of every
// valid group at or after position from, in journal order (payloads alias
// a buffer valid during the call only). A torn tail is the end; a group
// that is not valid with a valid one after it, a segment that does not
// continue the previous one, or a record that does not decode is
// ErrCorrupt: a crash leaves none of those, since each group is synced
// before the next is written and each segment is whole before its first
// group.
func Scan(fsys partlog.FS, dir string, from uint64, fn func(pos uint64, l Logged) error) (ScanResult, error) {
	if fsys == nil {
		fsys = partlog.OSFS{}
	}
	segs, err := listSegments(fsys, dir)
	if err != nil {
		return ScanResult{}, err
	}
	res := ScanResult{End: from}
	prevEnd := uint64(0)
	for i, s := range segs {
		last := i == len(segs)-1
		b, err := readAll(fsys, filepath.Join(dir, s.name))
		if err != nil {
			return res, err
		}
		hdrPrev, ok := segmentHeader(b, s.base)
		switch {
		case !ok && last && findGroupAfter(b, SegmentHeaderSize-1, s.base) < 0:
			// Its creation was cut short (the header is synced before any
			// group is written): no group is in it.
			res.End, res.Torn, res.Headerless = max(prevEnd, from), true, true
			return res, nil
		case !ok:
			return res, fmt.Errorf("%w: segment %s has no valid header", ErrCorrupt, s.name)
		case i > 0 && hdrPrev != prevEnd:
			return res, fmt.Errorf("%w: segment %s says the previous segment's groups end at %d, they end at %d", ErrCorrupt, s.name, hdrPrev, prevEnd)
		}
		off := int64(SegmentHeaderSize)
		for {
			pos := s.base + uint64(off)
			n, ok := validGroupAt(b, off, pos)
			if !ok {
				break
			}
			if pos >= from {
				err := decodeLogged(b[off+GroupHeaderSize:off+GroupHeaderSize+int64(n)], func(l Logged) error { return fn(pos, l) })
				if err != nil {
					return res, fmt.Errorf("group at %d: %w", pos, err)
				}
				res.Groups++
			}
			off += GroupHeaderSize + int64(n)
		}
		prevEnd = s.base + uint64(off)
		if later := findGroupAfter(b, off, s.base); later >= 0 {
			return res, fmt.Errorf("%w: segment %s: no valid group at %d, but one at %d", ErrCorrupt, s.name, prevEnd, s.base+uint64(later))
		}
		if last {
			res.End = max(prevEnd, from)
			// Bytes that are not zeros past the last group (the file is
			// written with zeros when prepared): a group whose write the
			// crash cut.
			res.Torn = !allZero(b[off:])
		}
	}
	return res, nil
}

// listSegments returns the journal's segment files in dir, by base.
func listSegments(fsys partlog.FS, dir string) ([]segmentFile, error) {
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	var segs []segmentFile
	for _, n := range names {
		if filepath.Ext(n) != segmentSuffix {
			continue
		}
		base, err := strconv.ParseUint(strings.TrimSuffix(n, segmentSuffix), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: segment name %q", ErrCorrupt, n)
		}
		segs = append(segs, segmentFile{name: n, base: base})
	}
	sort.Slice(segs, func(a, b int) bool { return segs[a].base < segs[b].base })
	return segs, nil
}

func readAll(fsys partlog.FS, path string) ([]byte, error) {
	f, err := fsys.OpenFile(path, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	b := make([]byte, st.Size())
	if n, err := f.ReadAt(b, 0); err != nil && !(err == io.EOF && n == len(b)) {
		return nil, fmt.Errorf("journal: read %s: %w", path, err)
	}
	return b, nil
}

// segmentHeader checks a segment's header against its name's base and
// returns the previous segment's end it records.
func segmentHeader(b []byte, base uint64) (prevEnd uint64, ok bool) {
	if len(b) < SegmentHeaderSize || binary.LittleEndian.Uint32(b[0:]) != segmentMagic ||
		binary.LittleEndian.Uint64(b[4:]) != base || binary.LittleEndian.Uint32(b[20:]) != crc32.Checksum(b[:20], castagnoli) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[12:]), true
}

// validGroupAt reports whether b holds a valid group of position pos at
// off, and its records' length.
func validGroupAt(b []byte, off int64, pos uint64) (int, bool) {
	if off+GroupHeaderSize > int64(len(b)) {
		return 0, false
	}
	n, err := groupLength(b[off:], pos)
	if err != nil || off+GroupHeaderSize+int64(n) > int64(len(b)) {
		return 0, false
	}
	if checkGroup(b[off:off+GroupHeaderSize+int64(n)], pos) != nil {
		return 0, false
	}
	return n, true
}

// findGroupAfter looks past off for any valid group of the position its
// place in the segment gives it, and returns its offset (-1: none). Only
// recovery calls it, once per segment.
func findGroupAfter(b []byte, off int64, base uint64) int64 {
	var magic [4]byte
	binary.LittleEndian.PutUint32(magic[:], groupMagic)
	for at := off + 1; at+GroupHeaderSize <= int64(len(b)); at++ {
		k := indexFrom(b, at, magic[:])
		if k < 0 {
			return -1
		}
		if _, ok := validGroupAt(b, k, base+uint64(k)); ok {
			return k
		}
		at = k
	}
	return -1
}

func indexFrom(b []byte, at int64, sep []byte) int64 {
	i := bytes.Index(b[at:], sep)
	if i < 0 {
		return -1
	}
	return at + int64(i)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
