package aggregator

import (
	"context"
	"fmt"
	"hash/crc32"
	"runtime"
	"sort"
	"sync"
	"time"
	"unsafe"

	"github.com/catena-streams/catena/internal/hugepages"
)

// Log is one partition of the checkpoint stream, as checkpoints use it:
// appends that answer with the records' offsets once they are committed,
// and reads of committed records.
type Log interface {
	// Append stores values in order and returns their offsets. An error
	// means some may be stored and some not.
	Append(ctx context.Context, partition uint32, values [][]byte) ([]uint64, error)
	// Read calls fn for every committed record from offset from up to the
	// committed end as of the call, in order.
	Read(ctx context.Context, partition uint32, from uint64, fn func(offset uint64, value []byte) error) error
	// Start is the partition's first offset (retention trims before it).
	Start(ctx context.Context, partition uint32) (uint64, error)
}

// DefaultChunkBytes bounds one chunk record's payload: well under the
// 1 MiB record limit, and small enough that a retried append is cheap.
const DefaultChunkBytes = 512 << 10

// capture is a checkpoint's content taken from the state under the
// shard's lock; written afterwards without it.
type capture struct {
	snapshot     bool
	chunks       [][]byte // chunk records, headers included
	refs         []chunkRef
	sourceOffset uint64
	groups       uint64
	skipped      uint64
	lost         uint64
	timeMs       int64
	epoch        int64
	bytes        int
}

// Checkpointer writes one shard's checkpoints: it knows the last one
// written (the base of the next increment) and when the next snapshot is
// due.
type Checkpointer struct {
	Plan       *Plan
	Log        Log
	Shard      uint32
	Partition  uint32 // of the checkpoint stream
	Writer     uint64 // random per process: tells two writers' chunks apart
	ChunkBytes int

	seq           uint64
	last          *manifest // nil: nothing written or loaded yet
	lastOffset    uint64
	sinceSnapshot int
	forceSnapshot bool

	// The snapshots a restore may fall back to: the current chain's and the
	// one before it. Retention is held at the older (see Holds).
	curSnap, prevSnap *snapRef
}

// snapRef locates a snapshot: its first chunk in the checkpoint stream and
// the source offset it covers.
type snapRef struct {
	firstChunk   uint64
	sourceOffset uint64
}

// Resume continues after a restored checkpoint chain: the next increment
// builds on the last manifest loaded.
func (c *Checkpointer) Resume(r *Restored) {
	if r == nil || r.last == nil {
		c.forceSnapshot = true
		return
	}
	c.last, c.lastOffset = r.last, r.lastOffset
	c.sinceSnapshot = r.sinceSnapshot
	c.curSnap = r.snap
}

// Due reports whether a checkpoint at sourceOffset would record anything
// new.
func (c *Checkpointer) Due(sourceOffset uint64) bool {
	return c.last == nil || c.forceSnapshot || c.last.SourceOffset != sourceOffset
}

// Capture takes the checkpoint's content from st, which must not change
// meanwhile (the caller holds the shard's lock), and clears st's changes.
func (c *Checkpointer) Capture(st *State, sourceOffset, lost uint64, now time.Time) *capture {
	cp := &capture{
		snapshot:     c.last == nil || c.forceSnapshot || c.sinceSnapshot+1 >= c.Plan.SnapshotEvery,
		sourceOffset: sourceOffset,
		groups:       uint64(st.Len()),
		skipped:      st.Skipped,
		lost:         lost,
		timeMs:       now.UnixMilli(),
		epoch:        now.UnixMilli() / c.Plan.Interval.Milliseconds(),
	}
	c.seq++
	limit := c.ChunkBytes
	if limit <= 0 {
		limit = DefaultChunkBytes
	}
	var (
		buf []byte
		n   uint32
	)
	flush := func() {
		h := chunkHeader{shard: c.Shard, writer: c.Writer, seq: c.seq, index: uint32(len(cp.chunks)), entries: n}
		rec := appendChunkHeader(make([]byte, 0, chunkHeaderLen+len(buf)), h)
		rec = append(rec, buf...)
		cp.chunks = append(cp.chunks, rec)
		cp.refs = append(cp.refs, chunkRef{CRC: crc32.Checksum(buf, castagnoli), Bytes: len(buf), Entries: n})
		cp.bytes += len(rec)
		buf, n = buf[:0], 0
	}
	add := func(k entryKey, e *entry) {
		buf = c.Plan.appendEntry(buf, k, e)
		n++
		if len(buf) >= limit {
			flush()
			buf = nil
		}
	}
	if cp.snapshot {
		for k, e := range st.all {
			add(k, e)
		}
	} else {
		for _, e := range st.dirty {
			add(e.key, e)
		}
	}
	if n > 0 {
		flush()
	}
	st.takeDirty()
	return cp
}

// Written is what Write stored.
type Written struct {
	ManifestOffset uint64
	Manifest       *manifest
	Bytes          int
	// HoldCheckpoints and HoldSource are where retention must be held on
	// the checkpoint partition and the source partition so that every
	// checkpoint a restore may fall back to stays readable.
	HoldCheckpoints, HoldSource uint64
}

// Write stores a captured checkpoint: chunks first, then the manifest
// that commits them. On error the checkpoint did not happen as far as a
// restore can tell (at worst its chunks are stored without a manifest:
// torn, never read), and the next one is a full snapshot, since the
// changes captured here are no longer tracked.
func (c *Checkpointer) Write(ctx context.Context, cp *capture) (*Written, error) {
	w, err := c.write(ctx, cp)
	if err != nil {
		c.forceSnapshot = true
	}
	return w, err
}

func (c *Checkpointer) write(ctx context.Context, cp *capture) (*Written, error) {
	m := &manifest{
		Shard: c.Shard, Writer: c.Writer, Seq: c.seq, Snapshot: cp.snapshot,
		Fingerprint: c.Plan.Fingerprint, SourceOffset: cp.sourceOffset, Epoch: cp.epoch, TimeMs: cp.timeMs,
		Groups: cp.groups, Skipped: cp.skipped, Lost: cp.lost, Chunks: cp.refs,
	}
	if !cp.snapshot {
		m.Base = c.lastOffset
	}
	if len(cp.chunks) > 0 {
		offs, err := c.Log.Append(ctx, c.Partition, cp.chunks)
		if err != nil {
			return nil, fmt.Errorf("failed to write checkpoint chunks of shard %d: %w", c.Shard, err)
		}
		for i := range m.Chunks {
			m.Chunks[i].Offset = offs[i]
		}
	}
	offs, err := c.Log.Append(ctx, c.Partition, [][]byte{encodeManifest(m)})
	if err != nil {
		return nil, fmt.Errorf("failed to write checkpoint manifest of shard %d: %w", c.Shard, err)
	}
	c.last, c.lastOffset = m, offs[0]
	c.forceSnapshot = false
	if cp.snapshot {
		c.sinceSnapshot = 0
		first := offs[0]
		if len(m.Chunks) > 0 {
			first = m.Chunks[0].Offset
		}
		c.prevSnap, c.curSnap = c.curSnap, &snapRef{firstChunk: first, sourceOffset: m.SourceOffset}
	} else {
		c.sinceSnapshot++
	}
	w := &Written{ManifestOffset: offs[0], Manifest: m, Bytes: cp.bytes}
	hold := c.prevSnap
	if hold == nil {
		hold = c.curSnap
	}
	if hold != nil {
		w.HoldCheckpoints, w.HoldSource = hold.firstChunk, hold.sourceOffset
	}
	return w, nil
}

// Restored is a shard's state loaded from its latest good checkpoint.
type Restored struct {
	State *State
	// SourceOffset is where to resume reading the source (0 with no
	// checkpoint: the caller starts at the source's beginning).
	SourceOffset uint64
	Lost         uint64
	// Loaded counts the checkpoints read (snapshot and increments); Skipped
	// explains the checkpoints passed over.
	Loaded  int
	Skipped []string
	// ReadTime is the time spent reading the checkpoint partition;
	// DecodeTime the time spent building the state.
	ReadTime, DecodeTime time.Duration

	last          *manifest
	lastOffset    uint64
	sinceSnapshot int
	snap          *snapRef
}

// Checkpoint is the loaded checkpoint's manifest offset and manifest (nil:
// none).
func (r *Restored) Checkpoint() (*manifest, uint64) { return r.last, r.lastOffset }

type seenChunk struct {
	h       chunkHeader
	payload []byte
}

type seenManifest struct {
	offset uint64
	m      *manifest
}

// Restore reads the checkpoint partition from offset from to its end and
// loads shard's latest good checkpoint: the manifest covering the most of
// the source whose chain (it, its bases back to a snapshot, all their
// chunks) is whole, uncorrupted and of plan's fingerprint. Any writer's
// checkpoints qualify: every one is the fold of a prefix of the same
// source partition. With none, it returns an empty state.
func Restore(ctx context.Context, log Log, plan *Plan, shard, partition uint32, from uint64) (*Restored, error) {
	t0 := time.Now()
	chunks := map[uint64]seenChunk{}
	byOffset := map[uint64]*manifest{}
	var (
		manifests []seenManifest
		skipped   []string
	)
	err := log.Read(ctx, partition, from, func(off uint64, v []byte) error {
		if h, payload, ok := parseChunk(v); ok {
			if h.shard == shard {
				chunks[off] = seenChunk{h: h, payload: payload}
			}
			return nil
		}
		m, ok, err := parseManifest(v)
		switch {
		case !ok:
		case err != nil:
			skipped = append(skipped, fmt.Sprintf("manifest at %d: %v", off, err))
		case m.Shard == shard:
			manifests = append(manifests, seenManifest{offset: off, m: m})
			byOffset[off] = m
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("failed to read checkpoints of shard %d: %w", shard, err)
	}
	read := time.Since(t0)
	sort.Slice(manifests, func(i, j int) bool {
		a, b := manifests[i], manifests[j]
		if a.m.SourceOffset != b.m.SourceOffset {
			return a.m.SourceOffset > b.m.SourceOffset
		}
		return a.offset > b.offset
	})
	for _, cand := range manifests {
		chain, why := chainOf(cand, byOffset, chunks, plan)
		if why != "" {
			skipped = append(skipped, fmt.Sprintf("checkpoint at %d (source offset %d): %s", cand.offset, cand.m.SourceOffset, why))
			continue
		}
		st, err := load(plan, chain, chunks)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("checkpoint at %d (source offset %d): %v", cand.offset, cand.m.SourceOffset, err))
			continue
		}
		last := cand.m
		st.Skipped = last.Skipped
		snap := chain[0]
		first := snap.offset
		if len(snap.m.Chunks) > 0 {
			first = snap.m.Chunks[0].Offset
		}
		return &Restored{
			State: st, SourceOffset: last.SourceOffset, Lost: last.Lost, Loaded: len(chain), Skipped: skipped,
			ReadTime: read, DecodeTime: time.Since(t0) - read,
			last: last, lastOffset: cand.offset, sinceSnapshot: len(chain) - 1,
			snap: &snapRef{firstChunk: first, sourceOffset: snap.m.SourceOffset},
		}, nil
	}
	return &Restored{State: NewState(plan, 0), Skipped: skipped, ReadTime: read, DecodeTime: time.Since(t0) - read}, nil
}

// chainOf walks from m back to its snapshot and checks every link and
// chunk; it returns the chain oldest first, or why it is not whole.
func chainOf(m seenManifest, byOffset map[uint64]*manifest, chunks map[uint64]seenChunk, plan *Plan) ([]seenManifest, string) {
	var chain []seenManifest
	for cur := m; ; {
		if cur.m.Fingerprint != plan.Fingerprint {
			return nil, fmt.Sprintf("written for another spec (fingerprint %s, now %s)", cur.m.Fingerprint, plan.Fingerprint)
		}
		for i, ref := range cur.m.Chunks {
			c, ok := chunks[ref.Offset]
			switch {
			case !ok:
				return nil, fmt.Sprintf("chunk %d at %d is missing", i, ref.Offset)
			case c.h.writer != cur.m.Writer || c.h.seq != cur.m.Seq || c.h.index != uint32(i) || c.h.entries != ref.Entries:
				return nil, fmt.Sprintf("record at %d is not its chunk %d", ref.Offset, i)
			case len(c.payload) != ref.Bytes || crc32.Checksum(c.payload, castagnoli) != ref.CRC:
				return nil, fmt.Sprintf("chunk %d at %d fails its checksum (corrupt)", i, ref.Offset)
			}
		}
		chain = append(chain, cur)
		if cur.m.Snapshot {
			break
		}
		base, ok := byOffset[cur.m.Base]
		if !ok || cur.m.Base >= cur.offset {
			return nil, fmt.Sprintf("its base checkpoint at %d is not readable", cur.m.Base)
		}
		cur = seenManifest{offset: cur.m.Base, m: base}
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	return chain, ""
}

// load builds the state of a validated chain. Each core reads every chunk
// (the snapshot's, then each increment's, in chain order, so a later value
// of a group wins) and fills its own share of the state's maps, decoding
// only the groups that fall in them: no intermediate copies, no locks.
func load(plan *Plan, chain []seenManifest, chunks map[uint64]seenChunk) (*State, error) {
	groups := int(chain[len(chain)-1].m.Groups)
	st, slots := newState(plan, groups, true)
	var advised sync.Mutex
	regions := []hugepages.Region{slots}
	advise := func(r ...hugepages.Region) {
		advised.Lock()
		regions = append(regions, r...)
		advised.Unlock()
	}
	// Once written, the arrays keep the huge pages they got, and are no
	// longer advised (see internal/hugepages).
	defer func() {
		for _, r := range regions {
			r.Done()
		}
	}()
	var refs []chunkRef
	entries := 0
	for _, c := range chain {
		refs = append(refs, c.m.Chunks...)
		for _, r := range c.m.Chunks {
			entries += int(r.Entries)
		}
	}
	// One copy of every chunk's bytes, made one string: each key is a
	// substring of it. The large arrays of the load are advised for huge
	// pages before they are first written (internal/hugepages: a fresh
	// process otherwise pays a page fault per 4 KiB of them).
	size := 0
	for _, ref := range refs {
		size += len(chunks[ref.Offset].payload)
	}
	buf := make([]byte, size)
	advise(hugepages.Advise(buf))
	strs := make([]string, len(refs))
	at := 0
	for i, ref := range refs {
		n := copy(buf[at:], chunks[ref.Offset].payload)
		strs[i] = unsafe.String(unsafe.SliceData(buf[at:]), n) // buf is never written again
		at += n
	}
	// At most one core per part: a worker owns the parts p%workers ==
	// its number.
	workers := min(runtime.GOMAXPROCS(0), stateParts)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			owned := 0
			for p := range stateParts {
				if p%workers == w {
					owned++
				}
			}
			// This worker's share of the entries and of the groups (keys
			// hash evenly over the parts), with room to spare. The
			// entries' arrays are sized for the groups: an entry that a
			// later checkpoint's replaces is garbage, and one beyond the
			// share comes from the slab's small arrays.
			share := func(n int) int { return n/stateParts*owned + n/(8*stateParts)*owned + 64 }
			sl := &slab{na: len(plan.aggregates)}
			advise(sl.reserve(share(groups)))
			own := func(k entryKey) (int, uint64, bool) {
				p, h := st.hash(k)
				return p, h, p%workers == w
			}
			// Decoded first, inserted after in slot order: inserting
			// as decoded touched a random slot of a table of tens of
			// megabytes each time (two thirds of the decode's time, in
			// cache and TLB misses). Each part's list is a piece of one
			// array; one that outgrows its piece moves out of it.
			var pending [stateParts][]pendingGroup
			room := make([]pendingGroup, share(entries))
			advise(hugepages.Advise(room))
			per := len(room) / owned
			for p, i := 0, 0; p < stateParts; p++ {
				if p%workers == w {
					pending[p] = room[i*per : i*per : (i+1)*per]
					i++
				}
			}
			put := func(p int, h uint64, e *entry) { pending[p] = append(pending[p], pendingGroup{h, e}) }
			for i, ref := range refs {
				if err := plan.decodeOwned(chunks[ref.Offset].payload, strs[i], ref.Entries, sl, own, put); err != nil {
					errs[w] = fmt.Errorf("checkpoint chunk at %d does not decode: %w", ref.Offset, err)
					return
				}
			}
			var scratch []pendingGroup
			for p := range pending {
				scratch = st.parts[p].fill(pending[p], scratch)
				pending[p] = nil
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return st, nil
}
