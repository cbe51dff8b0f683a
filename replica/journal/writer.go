package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/catena-streams/catena/replica/partlog"
)

// A journal segment file is named by its base, the journal position of its
// first byte, and starts with a header:
//
//	magic u32 | base u64 | previous-end u64 | crc u32
//
// previous-end is the position where the previous segment's groups ended
// (zero for the first segment), so that recovery knows a segment's last
// group from the padding a roll leaves: every group below it was synced
// before this segment was created, and one missing is damage, not a torn
// tail. Group positions are base plus the byte offset in the file.
const (
	segmentMagic      = 0x47455352 // "RSEG"
	SegmentHeaderSize = 4 + 8 + 8 + 4
	segmentSuffix     = ".jrn"
	// prepName is the next segment while it is prepared ahead: not a
	// segment (Scan and New look at ".jrn" files only) until a roll gives it
	// its header and renames it.
	prepName = "next.prep"
	// freeSuffix names a segment Release freed, kept to be the next
	// segment again (recycled): its blocks are written already, so it
	// needs no zeros, and its stale groups carry positions below any new
	// one, so none is ever read as a group at its new place.
	freeSuffix = ".free"
	// maxFree is how many freed segments are kept for recycling; Release
	// removes the others.
	maxFree = 8
	// DefaultSegmentBytes is a journal segment's size: files are written
	// with zeros to this size when prepared, so that a group commit writes
	// data only and its fdatasync changes no metadata (docs/journal.md).
	DefaultSegmentBytes = 64 << 20
	zeroChunk           = 1 << 20
)

// Options configure a journal.
type Options struct {
	Dir          string
	FS           partlog.FS // nil: the real file system
	SegmentBytes int64      // 0: DefaultSegmentBytes
}

// Ticket names the group a record was written in: Wait(t) returns once
// that group is durable.
type Ticket uint64

// Stats counts a journal's work since it was opened.
type Stats struct {
	Groups  uint64 // group commits: one write and one fdatasync each
	Records uint64 // appended (durable once their group is)
	Bytes   uint64 // group bytes written
	Rolls   uint64
	// Recycled counts rolls into a freed segment rather than one
	// written with zeros.
	Recycled uint64
	// Busy is the time the writer spent writing and syncing groups
	// (rolls included): against the time passed, how saturated the group
	// commit is; against Groups, what one costs.
	Busy time.Duration
}

// Journal is a replica process's journal: records of every partition,
// written in groups by one goroutine, each group one write and one
// fdatasync (group commit). Appends from any goroutine join the group being
// filled; the writer starts the next group as soon as one is synced, so a lone
// record waits for one write and one fdatasync, and under load a group holds
// whatever arrived during the previous one.
type Journal struct {
	fs       partlog.FS
	dir      string
	segBytes int64
	// groupLimit bounds a group's records (MaxGroupBytes; tests lower it):
	// an append that would pass it waits for the writer to take the group.
	groupLimit int

	mu      sync.Mutex
	cond    *sync.Cond // signalled when the writer takes a group (room for appends), fails or closes
	wake    chan struct{}
	buf     []byte // the group being filled: GroupHeaderSize reserved, then records
	spare   []byte
	filling Ticket // the group buf becomes
	synced  Ticket // the last group durable
	// fillingDone is closed once group filling is durable (or the journal
	// failed), writingDone once the group being written is: each waiter
	// waits on its own group's channel. A condition variable woke every
	// waiting partition at every group commit, those of the next group
	// too: with 256 partitions, hundreds of wake-ups per commit
	// (docs/benchmarks.md, 2026-12-05, fifth session).
	fillingDone, writingDone chan struct{}
	sleepers                 int    // Waits asleep on those (tests wait for them)
	end                      uint64 // the position after the last durable group
	err                      error  // sticky: the journal failed (or closed)
	closed                   bool
	stats                    Stats

	// Only the writer goroutine touches these after Open (and Close, once
	// the writer is done).
	seg     partlog.File
	segBase uint64
	segOff  int64
	// prep delivers the next segment, prepared ahead by prepareNext;
	// prepping says one is under way or waiting there.
	prep     chan prepared
	prepping bool

	// releaseMu serialises Release's removals.
	releaseMu sync.Mutex
	// free are the freed segments kept for recycling (paths, oldest
	// first), under freeMu.
	freeMu sync.Mutex
	free   []string

	done chan struct{}
}

// ErrClosed is returned by appends and waits after Close.
var ErrClosed = errors.New("journal: closed")

// New starts a new, empty journal in opts.Dir (which must hold no
// journal segment) at position start. Open continues an existing one.
func New(opts Options, start uint64) (*Journal, error) {
	opts, err := opts.prepare()
	if err != nil {
		return nil, err
	}
	segs, err := listSegments(opts.FS, opts.Dir)
	if err != nil {
		return nil, err
	}
	if len(segs) > 0 {
		return nil, fmt.Errorf("journal: %s already holds a journal (%s)", opts.Dir, segs[0].name)
	}
	return begin(opts, start)
}

// prepare fills in the defaults, checks opts and makes the directory.
func (opts Options) prepare() (Options, error) {
	if opts.FS == nil {
		opts.FS = partlog.OSFS{}
	}
	if opts.SegmentBytes == 0 {
		opts.SegmentBytes = DefaultSegmentBytes
	}
	if opts.SegmentBytes < SegmentHeaderSize+GroupHeaderSize+recordFixedSize+1 {
		return opts, fmt.Errorf("journal: segment size %d is too small", opts.SegmentBytes)
	}
	if err := opts.FS.MkdirAll(opts.Dir, 0o755); err != nil {
		return opts, fmt.Errorf("journal: %w", err)
	}
	return opts, nil
}

// newJournal is a journal whose next group goes at end, with no segment
// yet and its goroutines not started.
func newJournal(opts Options, end uint64) *Journal {
	j := &Journal{fs: opts.FS, dir: opts.Dir, segBytes: opts.SegmentBytes, groupLimit: MaxGroupBytes, wake: make(chan struct{}, 1),
		buf: make([]byte, GroupHeaderSize, 1<<20), spare: make([]byte, 0, 1<<20), filling: 1, fillingDone: make(chan struct{}),
		end: end, done: make(chan struct{}), prep: make(chan prepared, 1)}
	j.cond = sync.NewCond(&j.mu)
	return j
}

// begin starts a journal in a directory with no segment, its first
// segment at position start.
func begin(opts Options, start uint64) (*Journal, error) {
	j := newJournal(opts, start+SegmentHeaderSize)
	if err := j.listFree(); err != nil {
		return nil, err
	}
	if err := j.createSegment(start, 0); err != nil {
		return nil, err
	}
	j.prepareNext()
	go j.writer()
	return j, nil
}

// Open continues the journal in opts.Dir after a stop or a crash. It
// scans the journal with Scan's rules (a torn tail is its end, any other
// damage is ErrCorrupt, and nothing is changed then), calls fn with every
// record of every group at or after position from, and returns the
// journal, its next group going where the scan found the end, with the
// scan's result over the whole journal (its Groups counts every group).
//
// Before any group is written:
//   - What a crash left past the end (a group cut short) is overwritten
//     with zeros and synced: the new groups are written where it was, and
//     no byte of it may be read with them, or taken for damage after them.
//   - A last segment whose creation was cut short (no valid header, so no
//     group) is removed, and the directory synced.
//   - A last segment shorter than opts.SegmentBytes is zero-filled to it.
//
// A directory with no segment starts a new journal at from, as New does
// (or at the base of the headerless segment removed, if greater). A from
// past the end of a journal that has segments is ErrCorrupt: the caller
// counts on groups it does not hold.
//
// Positions past the end may be used again: those of a group cut short
// (never acknowledged, and zeroed first) and those of a removed
// headerless segment (which held none).
func Open(opts Options, from uint64, fn func(pos uint64, l Logged) error) (*Journal, ScanResult, error) {
	opts, err := opts.prepare()
	if err != nil {
		return nil, ScanResult{}, err
	}
	segs, err := listSegments(opts.FS, opts.Dir)
	if err != nil {
		return nil, ScanResult{}, err
	}
	// Read what is on the disk, not what this process may still have
	// cached: after a failed fdatasync the group's pages stay cached and
	// clean though they never reached the disk, and a journal reopened in
	// the same process would hand them over as records and write new
	// groups after them (partlog's recovery does the same, step 3a).
	for _, sg := range segs {
		if err := readSegmentFromDisk(opts.FS, filepath.Join(opts.Dir, sg.name)); err != nil {
			return nil, ScanResult{}, err
		}
	}
	// Scanned from the start, so that the end found is the journal's, not
	// from (Scan reports the greater of the two).
	res, err := Scan(opts.FS, opts.Dir, 0, func(pos uint64, l Logged) error {
		if pos < from {
			return nil
		}
		return fn(pos, l)
	})
	if err != nil {
		return nil, res, err
	}
	start := max(res.End, from)
	var cut *segmentFile // a last segment whose creation was cut short: it holds no group
	if res.Headerless {
		cut = &segs[len(segs)-1]
		segs, start = segs[:len(segs)-1], max(start, cut.base)
	}
	if len(segs) > 0 && from > res.End {
		// The caller's state says groups were durable up to from; the
		// journal ends before it. Refused before anything is changed.
		return nil, res, fmt.Errorf("%w: asked to read from %d, but the journal ends at %d", ErrCorrupt, from, res.End)
	}
	if cut != nil {
		if err := opts.FS.Remove(filepath.Join(opts.Dir, cut.name)); err != nil {
			return nil, res, fmt.Errorf("journal: %w", err)
		}
		if err := opts.FS.SyncDir(opts.Dir); err != nil {
			return nil, res, fmt.Errorf("journal: %w", err)
		}
	}
	if len(segs) == 0 {
		j, err := begin(opts, start)
		if err != nil {
			return nil, res, err
		}
		res.End = j.end
		return j, res, nil
	}
	last := segs[len(segs)-1]
	path := filepath.Join(opts.Dir, last.name)
	f, err := opts.FS.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, res, fmt.Errorf("journal: %w", err)
	}
	j, err := resume(opts, f, path, last.base, res.End)
	if err != nil {
		f.Close()
		return nil, res, err
	}
	return j, res, nil
}

// resume continues the journal in f, the segment at base, at position end.
func resume(opts Options, f partlog.File, path string, base, end uint64) (*Journal, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	size := st.Size()
	if end < base+SegmentHeaderSize || int64(end-base) > size {
		return nil, fmt.Errorf("%w: the journal ends at %d, outside its last segment %s (%d bytes)", ErrCorrupt, end, path, size)
	}
	off := int64(end - base)
	dirty, err := zeroPast(f, off, size)
	if err != nil {
		return nil, fmt.Errorf("journal: segment %s: %w", path, err)
	}
	if size < opts.SegmentBytes {
		if err := zeroRange(f, size, opts.SegmentBytes); err != nil {
			return nil, fmt.Errorf("journal: segment %s: %w", path, err)
		}
		dirty = true
	}
	if dirty {
		if err := f.Sync(); err != nil {
			return nil, fmt.Errorf("journal: segment %s: %w", path, err)
		}
	}
	j := newJournal(opts, end)
	if err := j.listFree(); err != nil {
		return nil, err
	}
	j.seg, j.segBase, j.segOff = f, base, off
	j.prepareNext()
	go j.writer()
	return j, nil
}

// zeroPast overwrites with zeros whatever is not zero in f from off to
// size, and says whether it wrote.
func zeroPast(f partlog.File, off, size int64) (bool, error) {
	buf := make([]byte, zeroChunk)
	for at := off; at < size; at += zeroChunk {
		b := buf[:min(zeroChunk, size-at)]
		if _, err := f.ReadAt(b, at); err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}
		if !allZero(b) {
			return true, zeroRange(f, at, size)
		}
	}
	return false, nil
}

// zeroRange writes zeros over [from, to) of f.
func zeroRange(f partlog.File, from, to int64) error {
	zeros := make([]byte, zeroChunk)
	for at := from; at < to; at += zeroChunk {
		if _, err := f.WriteAt(zeros[:min(zeroChunk, to-at)], at); err != nil {
			return err
		}
	}
	return nil
}

func segmentName(base uint64) string { return fmt.Sprintf("%020d%s", base, segmentSuffix) }

// createSegment makes the segment at base (the previous segment's groups
// ending at prevEnd) whole on disk before any group goes in it: zeros to
// the segment size, header, fsync, and the directory's fsync. A roll does
// the same with a file prepared ahead (roll); only the first segment is
// made here, by New.
func (j *Journal) createSegment(base, prevEnd uint64) error {
	path := filepath.Join(j.dir, segmentName(base))
	f, err := j.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := zeroFill(f, j.segBytes); err != nil {
		f.Close()
		return fmt.Errorf("journal: segment %s: %w", path, err)
	}
	return j.install(f, path, base, prevEnd)
}

// zeroFill writes zeros to size: the blocks are then allocated and
// written, so that a group's fdatasync has no metadata to write.
//
// Not fallocate, though it measured much cheaper (docs/benchmarks.md,
// 2026-12-05, fifth session): a fallocated block is an unwritten extent,
// and the first write into it changes the extent, which fdatasync must
// write. On ext4 without a journal (this project's test VMs) fdatasync did
// not write an inode changed that way before a kernel fix of 2026, and an
// acknowledged group would read back as zeros after a power loss: cut
// cleanly, with no error. Zeros cost bytes; recycling segments a
// checkpoint freed will save them.
func zeroFill(f partlog.File, size int64) error {
	return zeroRange(f, 0, size)
}

// install writes the header of segment base into f (zero-filled),
// fsyncs it, renames it to its segment name when it was prepared under
// another (from), makes the directory durable, and makes it the segment
// groups go to. The header is durable before the name is: a crash leaves
// the file under prepName (not a segment) or a valid empty segment, and
// no group is written in it before the directory's fsync.
func (j *Journal) install(f partlog.File, from string, base, prevEnd uint64) error {
	path := filepath.Join(j.dir, segmentName(base))
	fail := func(err error) error {
		f.Close()
		return fmt.Errorf("journal: segment %s: %w", path, err)
	}
	hdr := make([]byte, SegmentHeaderSize)
	binary.LittleEndian.PutUint32(hdr[0:], segmentMagic)
	binary.LittleEndian.PutUint64(hdr[4:], base)
	binary.LittleEndian.PutUint64(hdr[12:], prevEnd)
	binary.LittleEndian.PutUint32(hdr[20:], crc32.Checksum(hdr[:20], castagnoli))
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if from != path {
		if err := j.fs.Rename(from, path); err != nil {
			return fail(err)
		}
	}
	if err := j.fs.SyncDir(j.dir); err != nil {
		return fail(err)
	}
	old := j.seg
	j.seg, j.segBase, j.segOff = f, base, SegmentHeaderSize
	if old != nil {
		if err := old.Close(); err != nil {
			return fmt.Errorf("journal: closing the segment before %s: %w", path, err)
		}
	}
	return nil
}

// prepared is a next segment zero-filled ahead, or a freed one recycled
// (from: its name until a roll renames it), or why there is none.
type prepared struct {
	f    partlog.File
	from string
	err  error
}

// prepareNext starts preparing the next segment in the background (zeros
// written and synced), so that a roll only writes a header and renames:
// zero-filling 64 MiB inside the group commit held every partition's
// durability for it (docs/benchmarks.md, 2026-12-05, fifth session).
func (j *Journal) prepareNext() {
	j.prepping = true
	free := j.takeFree()
	go func() {
		if free != "" {
			if f, err := j.recycle(free); err == nil {
				j.prep <- prepared{f: f, from: free}
				return
			}
			// Not reusable (the next start finds it again): zeros.
		}
		path := filepath.Join(j.dir, prepName)
		f, err := j.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err == nil {
			if err = zeroFill(f, j.segBytes); err == nil {
				err = f.Sync()
			}
			if err != nil {
				f.Close()
				f = nil
			}
		}
		if err != nil {
			err = fmt.Errorf("journal: preparing the next segment: %w", err)
		}
		j.prep <- prepared{f: f, from: path, err: err}
	}()
}

// takeFree takes the oldest freed segment kept for recycling ("": none).
func (j *Journal) takeFree() string {
	j.freeMu.Lock()
	defer j.freeMu.Unlock()
	if len(j.free) == 0 {
		return ""
	}
	path := j.free[0]
	j.free = j.free[1:]
	return path
}

// recycle opens a freed segment to be the next one: written to at least
// the segment size already (zeros added where it is shorter), its old
// header and groups left for the roll to write over or leave behind.
func (j *Journal) recycle(path string) (partlog.File, error) {
	f, err := j.fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && st.Size() < j.segBytes {
		if err = zeroRange(f, st.Size(), j.segBytes); err == nil {
			err = f.Sync()
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// listFree finds the freed segments in the journal's directory.
func (j *Journal) listFree() error {
	names, err := j.fs.ReadDir(j.dir)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.freeMu.Lock()
	defer j.freeMu.Unlock()
	for _, n := range names {
		if strings.HasSuffix(n, freeSuffix) {
			j.free = append(j.free, filepath.Join(j.dir, n))
		}
	}
	return nil
}

// roll makes the segment at base the one groups go to, from the file
// prepared ahead (waiting for it if it is not ready), and starts
// preparing the next.
func (j *Journal) roll(base, prevEnd uint64) error {
	p := <-j.prep
	j.prepping = false
	if p.err != nil {
		return p.err
	}
	if err := j.install(p.f, p.from, base, prevEnd); err != nil {
		return err
	}
	if strings.HasSuffix(p.from, freeSuffix) {
		j.mu.Lock()
		j.stats.Recycled++
		j.mu.Unlock()
	}
	j.prepareNext()
	return nil
}

// datasync makes f's written data durable: fdatasync where the file has a
// descriptor (segments are written with zeros to their size when
// prepared, so a group's write changes no metadata it would have to
// write, the modification time aside), else the File's Sync (tests' file
// systems).
func datasync(f partlog.File) error {
	if d, ok := f.(interface{ Fd() uintptr }); ok {
		for {
			err := unix.Fdatasync(int(d.Fd()))
			if err != unix.EINTR {
				return err
			}
		}
	}
	return f.Sync()
}

// Append adds records to the group being filled and returns its ticket.
// Records of one partition must be appended in their order; the journal
// keeps the order of appends.
//
// A group holds at most MaxGroupBytes of records: an append that would
// pass it waits until the writer has taken the group being filled, which
// also holds appenders back while one group is written.
func (j *Journal) Append(recs ...*Logged) (Ticket, error) {
	if len(recs) == 0 {
		return 0, errors.New("journal: an append of no records")
	}
	size := 0
	for _, r := range recs {
		if err := r.validate(); err != nil {
			return 0, err
		}
		size += r.encodedSize()
	}
	if size > j.groupLimit {
		return 0, fmt.Errorf("journal: %d bytes of records in one append, over a group's %d", size, j.groupLimit)
	}
	j.mu.Lock()
	for j.err == nil && len(j.buf)-GroupHeaderSize+size > j.groupLimit {
		j.cond.Wait()
	}
	if j.err != nil {
		err := j.err
		j.mu.Unlock()
		return 0, err
	}
	for _, r := range recs {
		j.buf = appendLogged(j.buf, r)
	}
	j.stats.Records += uint64(len(recs))
	t := j.filling
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
	return t, nil
}

// Wait returns once the group of t is durable, or the journal's error.
func (j *Journal) Wait(t Ticket) error {
	j.mu.Lock()
	for {
		if j.synced >= t {
			j.mu.Unlock()
			return nil
		}
		if j.err != nil {
			err := j.err
			j.mu.Unlock()
			return err
		}
		if t > j.filling || (t == j.filling && len(j.buf) == GroupHeaderSize) {
			j.mu.Unlock()
			return fmt.Errorf("journal: wait for group %d, which no append was given", t)
		}
		// Groups are written in order, one at a time: a group not yet
		// durable is the one being written or the one being filled.
		ch := j.fillingDone
		if t < j.filling {
			ch = j.writingDone
		}
		j.sleepers++
		j.mu.Unlock()
		<-ch
		j.mu.Lock()
		j.sleepers--
	}
}

// failLocked makes err the journal's and wakes everything waiting.
func (j *Journal) failLocked(err error) {
	j.err = err
	if j.writingDone != nil {
		close(j.writingDone)
		j.writingDone = nil
	}
	close(j.fillingDone)
	j.fillingDone = make(chan struct{}) // closed once: Wait sees the error first
	j.cond.Broadcast()
}

// End is the position after the last durable group: where the next group
// goes, at the start of its segment's groups while none is durable.
func (j *Journal) End() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.end
}

// Stats returns the journal's counters.
func (j *Journal) Stats() Stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.stats
}

// Close writes what was appended, syncs it and stops the writer. Calls
// after the first return nil.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
	<-j.done
	// The writer is done: what follows is Close's alone, and runs without
	// the lock, so that a preparation still under way holds up no Stats,
	// End or Wait meanwhile.
	j.mu.Lock()
	err := j.err
	j.mu.Unlock()
	if errors.Is(err, ErrClosed) {
		err = nil
	}
	if cerr := j.seg.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("journal: %w", cerr)
	}
	if j.prepping {
		j.prepping = false
		if p := <-j.prep; p.f != nil {
			p.f.Close()
		}
	}
	// The next segment, prepared ahead and never used, or left half
	// prepared by a failure: not a segment, so nothing to keep.
	if rerr := j.fs.Remove(filepath.Join(j.dir, prepName)); err == nil && rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = fmt.Errorf("journal: %w", rerr)
	}
	return err
}

// writer is the group commit: it takes the group being filled, writes it
// at the journal's end, fsyncs, and publishes it durable; then the next.
func (j *Journal) writer() {
	defer close(j.done)
	for {
		j.mu.Lock()
		for len(j.buf) == GroupHeaderSize && !j.closed {
			j.mu.Unlock()
			<-j.wake
			j.mu.Lock()
		}
		if len(j.buf) == GroupHeaderSize { // closed, and nothing left
			j.failLocked(ErrClosed)
			j.mu.Unlock()
			return
		}
		group, t := j.buf, j.filling
		j.buf, j.spare = j.spare[:GroupHeaderSize], nil
		j.filling++
		j.writingDone, j.fillingDone = j.fillingDone, make(chan struct{})
		j.cond.Broadcast() // room for appends waiting on a full group
		j.mu.Unlock()

		began := time.Now()
		end, err := j.write(group)
		busy := time.Since(began)
		j.mu.Lock()
		if err != nil {
			j.failLocked(err)
			j.mu.Unlock()
			return
		}
		j.synced, j.end = t, end
		close(j.writingDone)
		j.writingDone = nil
		j.stats.Groups++
		j.stats.Bytes += uint64(len(group))
		j.stats.Busy += busy
		j.spare = group[:0]
		j.cond.Broadcast()
		j.mu.Unlock()
	}
}

// write writes and syncs one group, rolling to a new segment first when
// it does not fit in this one (a group larger than a segment goes alone
// into a fresh one, which grows past the segment size). It returns the
// position after it.
func (j *Journal) write(group []byte) (uint64, error) {
	if j.segOff+int64(len(group)) > j.segBytes && j.segOff > SegmentHeaderSize {
		prevEnd := j.segBase + uint64(j.segOff)
		// After a group larger than a segment, the file is larger too.
		next := j.segBase + uint64(max(j.segBytes, j.segOff))
		if err := j.roll(next, prevEnd); err != nil {
			return 0, err
		}
		j.mu.Lock()
		j.stats.Rolls++
		j.mu.Unlock()
	}
	pos := j.segBase + uint64(j.segOff)
	sealGroup(group, pos)
	if _, err := j.seg.WriteAt(group, j.segOff); err != nil {
		return 0, fmt.Errorf("journal: write of the group at %d: %w", pos, err)
	}
	if err := datasync(j.seg); err != nil {
		return 0, fmt.Errorf("journal: fdatasync of the group at %d: %w", pos, err)
	}
	j.segOff += int64(len(group))
	return pos + uint64(len(group)), nil
}

// readSegmentFromDisk makes the next reads of the segment at path come
// from the disk (partlog.ReadFromDisk).
func readSegmentFromDisk(fsys partlog.FS, path string) error {
	f, err := fsys.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	if err := partlog.ReadFromDisk(f); err != nil {
		return fmt.Errorf("journal: %s: %w", path, err)
	}
	return nil
}

// Release frees the segments that end at or before position before,
// oldest first, each followed by a directory fsync, so that a crash
// leaves a journal that starts later, never one with a hole: the caller's
// checkpoint, durable at or after before, needs none of their groups.
// Up to maxFree freed segments are kept, renamed, to be recycled as next
// segments; the others are removed. The segment being written is never
// freed. It returns how many it freed.
func (j *Journal) Release(before uint64) (int, error) {
	j.releaseMu.Lock()
	defer j.releaseMu.Unlock()
	segs, err := listSegments(j.fs, j.dir)
	if err != nil {
		return 0, err
	}
	n := 0
	// A segment ends where the next begins; the last has no next and is
	// the one being written (or about to be, after a roll).
	for i := 0; i+1 < len(segs) && segs[i+1].base <= before; i++ {
		path := filepath.Join(j.dir, segs[i].name)
		j.freeMu.Lock()
		keep := len(j.free) < maxFree
		j.freeMu.Unlock()
		var err error
		if keep {
			err = j.fs.Rename(path, strings.TrimSuffix(path, segmentSuffix)+freeSuffix)
		} else {
			err = j.fs.Remove(path)
		}
		if err != nil {
			return n, fmt.Errorf("journal: release %s: %w", segs[i].name, err)
		}
		if err := j.fs.SyncDir(j.dir); err != nil {
			return n, fmt.Errorf("journal: release %s: %w", segs[i].name, err)
		}
		if keep {
			j.freeMu.Lock()
			j.free = append(j.free, strings.TrimSuffix(path, segmentSuffix)+freeSuffix)
			j.freeMu.Unlock()
		}
		n++
	}
	return n, nil
}
