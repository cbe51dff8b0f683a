package journal

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
)

// Store is a replica process's partition logs over one journal
// (docs/journal.md): each log hands its frames, truncations and resets to
// the journal, whose group commit makes them durable, and the store's
// flusher fsyncs the logs' segment files now and then and writes a
// checkpoint record, after which the journal before it is released.
// OpenStore recovers: it replays the journal from its last checkpoint into
// the logs before any of them is used.
type Store struct {
	opts StoreOptions
	fs   partlog.FS
	j    *Journal

	// mu guards members and unjournaled; Create and Drop hold it across
	// their records, and a checkpoint while it takes the journal's
	// position and the members, so that a partition created or dropped
	// is either in a checkpoint or has its record after the checkpoint's
	// position.
	mu      sync.Mutex
	members map[PartitionID]*member
	// unjournaled are partitions whose logs could not be opened (corrupt):
	// kept out of the journal, their checkpoint entries say so
	// (Unjournaled), so that no recovery cuts or removes them.
	unjournaled map[PartitionID]uint64

	ckMu      sync.Mutex // one checkpoint at a time
	lastBytes uint64     // journal bytes at the last checkpoint (under ckMu)
	stats     StoreStats // under ckMu

	stop chan struct{}
	done chan struct{}

	// afterSnapshot, when set (tests), runs in Checkpoint between its
	// snapshot and its flushes.
	afterSnapshot func()
}

// StoreOptions configure a Store.
type StoreOptions struct {
	// Journal is the journal's directory and segment size; its FS is the
	// store's, for the partitions' logs too.
	Journal Options
	// LogOptions gives a partition's log options: its directory and
	// limits (FS, Flushed and Empty are the store's).
	LogOptions func(PartitionID) partlog.Options
	// CheckpointEvery and CheckpointBytes: the flusher checkpoints when
	// this long has passed or this many journal bytes were written since
	// the last checkpoint (defaults 5 s and 256 MiB; a negative interval
	// runs no flusher: tests call Checkpoint).
	CheckpointEvery time.Duration
	CheckpointBytes uint64
	// DirectFrameBytes: a frame of at least this many bytes is written
	// to its partition's segment file only, which Sync fsyncs, and the
	// journal records where it is (partlog.Options.DirectFrameBytes); a
	// smaller one is copied into the journal. 0: DefaultDirectFrameBytes;
	// negative: every frame is copied.
	DirectFrameBytes int
	// OnError hears a checkpoint that failed (a segment file's fsync or
	// the journal's write): the process must crash-stop, since the logs
	// involved have failed. nil: the error is only returned to the next
	// Checkpoint caller.
	OnError func(error)
}

// StoreStats counts a store's checkpoints.
type StoreStats struct {
	Checkpoints uint64
	Flushes     uint64 // logs flushed for checkpoints (an fsync each, unless nothing was new)
	Released    uint64 // journal segments released
}

// DefaultDirectFrameBytes is the size from which a frame is written to its
// segment file only (StoreOptions.DirectFrameBytes). Below it, copying the
// frame into the journal costs less than an fsync of the segment file of
// its own: many partitions' small appends share one group commit. Above
// it, the second copy costs more than the fsync (docs/benchmarks.md).
const DefaultDirectFrameBytes = 128 << 10

// Unjournaled as a checkpoint entry's flushed offset: the partition's log
// is not journaled (it failed to open), and recovery opens it as it is.
const Unjournaled = math.MaxUint64

// Opened is what OpenStore made of a partition: its log, journaled, or the
// error that keeps its log from opening (it is kept on disk, out of the
// journal), or Removed: the journal says it was dropped, or it was
// created and the process stopped before its create record was durable
// (it never took a frame). The caller removes a removed partition's
// directory.
type Opened struct {
	Log     *partlog.Log
	Err     error
	Removed bool
}

type member struct {
	id  PartitionID
	inc uint64
	log *partlog.Log
}

// incarnationFile, in a partition's directory, holds the incarnation the
// journal's records name it by, as 16 hex digits and a newline.
const incarnationFile = "incarnation"

// OpenStore opens the journal in opts.Journal.Dir and the partitions found
// on disk (onDisk: those whose directories the caller found), recovering
// them from the journal (docs/journal.md, "Recovery"):
//
//  1. The journal is scanned whole (a torn tail cut), its last checkpoint
//     found, and Replay plans each partition from the records after the
//     checkpoint's position.
//  2. Each log is opened cut at its plan's flushed offset (or empty at a
//     reset), and the planned frames are written into it from the journal,
//     then fsynced.
//  3. A checkpoint is written with every log's end, and the journal before
//     it released.
//
// A journal with no checkpoint is a first start (the partitions' logs were
// plain, or the first start stopped before its checkpoint): every log is
// opened as it is, given an incarnation if it has none, and checkpointed.
// An error is the whole store's (a corrupt journal, a failed fsync); a
// partition whose log does not open is reported in its Opened only.
func OpenStore(opts StoreOptions, onDisk []PartitionID) (*Store, map[PartitionID]Opened, error) {
	if opts.LogOptions == nil {
		return nil, nil, errors.New("journal: StoreOptions.LogOptions is nil")
	}
	if opts.Journal.FS == nil {
		opts.Journal.FS = partlog.OSFS{}
	}
	if opts.CheckpointEvery == 0 {
		opts.CheckpointEvery = 5 * time.Second
	}
	if opts.CheckpointBytes == 0 {
		opts.CheckpointBytes = 256 << 20
	}
	switch {
	case opts.DirectFrameBytes == 0:
		opts.DirectFrameBytes = DefaultDirectFrameBytes
	case opts.DirectFrameBytes < 0:
		opts.DirectFrameBytes = 0
	}
	s := &Store{
		opts:        opts,
		fs:          opts.Journal.FS,
		members:     map[PartitionID]*member{},
		unjournaled: map[PartitionID]uint64{},
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	// 1. Every record's place, and the last checkpoint.
	type placed struct {
		pos uint64
		rec Record
	}
	var (
		all   []placed
		cp    *Checkpoint
		cpErr error
	)
	j, _, err := Open(opts.Journal, 0, func(pos uint64, l Logged) error {
		if l.Kind == CheckpointRecord {
			entries, err := DecodeCheckpoint(l.Payload)
			if err != nil {
				cpErr = err
				return err
			}
			cp = &Checkpoint{Position: l.Base, Entries: entries}
			return nil
		}
		if l.Kind == Frame && len(l.Payload) >= partlog.FrameHeaderSize {
			// Its CRC, as a Written record carries it: recovery keeps a
			// frame the segment file holds whole.
			if h, err := partlog.DecodeHeader(l.Payload[:partlog.FrameHeaderSize]); err == nil {
				l.Rolling = h.CRC
			}
		}
		all = append(all, placed{pos, l.Record})
		return nil
	})
	if err != nil {
		if cpErr != nil {
			err = cpErr
		}
		return nil, nil, err
	}
	s.j = j
	fail := func(err error) (*Store, map[PartitionID]Opened, error) {
		s.j.Close()
		return nil, nil, err
	}
	opened := map[PartitionID]Opened{}
	if cp == nil {
		if len(all) > 0 {
			return fail(fmt.Errorf("%w: %d records and no checkpoint before them", ErrCorrupt, len(all)))
		}
		if err := s.firstStart(onDisk, opened); err != nil {
			s.closeLogs(opened)
			return fail(err)
		}
	} else {
		// Records from the checkpoint's position on: frames journalled
		// while it was taken are among them, before its record.
		var records []Record
		for _, p := range all {
			if p.pos >= cp.Position {
				records = append(records, p.rec)
			}
		}
		if err := s.recover(*cp, records, onDisk, opened); err != nil {
			s.closeLogs(opened)
			return fail(err)
		}
	}
	// What each log holds is durable in its files: from here on the
	// journal makes its changes durable.
	for id, m := range s.members {
		err := m.log.Sync()
		if err == nil {
			err = m.log.UseJournal(s.partition(id, m.inc))
		}
		if err != nil {
			s.closeLogs(opened)
			return fail(fmt.Errorf("journal: partition %s: %w", id, err))
		}
	}
	// 3. A checkpoint, and the journal before it goes.
	if err := s.Checkpoint(); err != nil {
		s.closeLogs(opened)
		return fail(err)
	}
	if opts.CheckpointEvery > 0 {
		go s.flusher()
	} else {
		close(s.done)
	}
	return s, opened, nil
}

// firstStart opens every partition's log as it is and gives each an
// incarnation.
func (s *Store) firstStart(onDisk []PartitionID, opened map[PartitionID]Opened) error {
	for _, id := range onDisk {
		lo := s.logOptions(id, nil, nil)
		inc, err := readIncarnation(s.fs, lo.Dir)
		if err == nil && inc == 0 {
			inc, err = newIncarnation()
			if err == nil {
				err = writeIncarnation(s.fs, lo.Dir, inc)
			}
			if err != nil {
				return fmt.Errorf("journal: partition %s: %w", id, err)
			}
		}
		if err != nil {
			// Unreadable: the partition fails; its files stay as they are.
			opened[id] = Opened{Err: fmt.Errorf("%w: %v", partlog.ErrCorrupt, err)}
			continue
		}
		s.open(id, inc, lo, opened)
	}
	return nil
}

// recover plans from the checkpoint and the records after it, opens the
// logs as planned and writes the planned frames into them.
func (s *Store) recover(cp Checkpoint, records []Record, onDisk []PartitionID, opened map[PartitionID]Opened) error {
	disk := map[PartitionID]OnDisk{}
	unreadable := map[PartitionID]error{}
	for _, id := range onDisk {
		dir := s.opts.LogOptions(id).Dir
		inc, err := readIncarnation(s.fs, dir)
		if err != nil {
			// Planned as the incarnation the checkpoint names (none: an
			// orphan), and then kept out of the journal, not removed:
			// which incarnation its files are is not known.
			unreadable[id] = err
			inc = cp.Entries[id].Incarnation
		}
		start, _, err := partlog.StartOnDisk(s.fs, dir)
		if err != nil {
			return fmt.Errorf("journal: partition %s: %w", id, err)
		}
		disk[id] = OnDisk{Incarnation: inc, Start: start}
	}
	plans, err := Replay(cp, records, disk)
	if err != nil {
		return err
	}
	for id, err := range unreadable {
		opened[id] = Opened{Err: fmt.Errorf("%w: %v", partlog.ErrCorrupt, err)}
		s.unjournaled[id] = plans[id].Incarnation
		delete(plans, id)
	}
	// Frames to write, by their index in records.
	writeTo := map[int]PartitionID{}
	for id, pl := range plans {
		switch {
		case pl.Dropped || pl.Orphan:
			opened[id] = Opened{Removed: true}
			continue
		case pl.Keep == Unjournaled:
			// Left out of the journal: opened as it is, and, if it still
			// does not open, left out again.
			s.open(id, pl.Incarnation, s.logOptions(id, nil, nil), opened)
			continue
		}
		lo := s.logOptions(id, &pl.Keep, pl.ResetTo)
		for _, i := range pl.Writes {
			lo.Verify = append(lo.Verify, partlog.FrameCheck{Base: records[i].Base, End: records[i].End, CRC: records[i].Rolling})
		}
		if pl.ResetTo != nil {
			// Its directory and incarnation may not have reached the
			// disk: the create record is the authority.
			if err := writeIncarnation(s.fs, lo.Dir, pl.Incarnation); err != nil {
				return fmt.Errorf("journal: partition %s: %w", id, err)
			}
			lo.Flushed = nil
		}
		if !s.open(id, pl.Incarnation, lo, opened) {
			continue
		}
		for _, i := range pl.Writes {
			writeTo[i] = id
		}
	}
	// Planned frames the segment files did not hold, from the journal
	// (Replay planned without their bytes), up to the first Written one
	// they did not hold: its bytes were only ever in the file, so it was
	// never acknowledged, nor anything after it. records are the
	// checkpoint's position on, checkpoint records left out, in the same
	// order a scan from there gives.
	ended := map[PartitionID]bool{}
	if len(writeTo) > 0 {
		i := 0
		if _, err := Scan(s.fs, s.opts.Journal.Dir, cp.Position, func(pos uint64, l Logged) error {
			if l.Kind == CheckpointRecord {
				return nil
			}
			defer func() { i++ }()
			id, ok := writeTo[i]
			if !ok || ended[id] {
				return nil
			}
			r := records[i]
			if r.Kind != l.Kind || r.Part != l.Part || r.Base != l.Base || r.End != l.End {
				return fmt.Errorf("%w: record %d read again is not the record planned from", ErrCorrupt, i)
			}
			m := s.members[id]
			switch {
			case m == nil: // failed meanwhile
				return nil
			case r.End <= m.log.NextOffset():
				return nil // the segment file held it whole
			case r.Kind == Written:
				ended[id] = true
				return nil
			}
			if err := m.log.Append(l.Payload); err != nil {
				// A frame the journal holds that the log refuses: the
				// partition fails, the others go on.
				s.failMember(id, fmt.Errorf("%w: replaying frame [%d,%d) from the journal: %v", partlog.ErrCorrupt, l.Base, l.End, err), opened)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// open opens a partition's log with lo and makes it a member, or records
// why it did not open (a corrupt log stays on disk, unjournaled). It says
// whether the log is open.
func (s *Store) open(id PartitionID, inc uint64, lo partlog.Options, opened map[PartitionID]Opened) bool {
	l, err := partlog.Open(lo)
	if err != nil {
		opened[id] = Opened{Err: err}
		s.unjournaled[id] = inc
		return false
	}
	s.members[id] = &member{id: id, inc: inc, log: l}
	opened[id] = Opened{Log: l}
	return true
}

// failMember closes a member's log and keeps the partition out of the
// journal.
func (s *Store) failMember(id PartitionID, err error, opened map[PartitionID]Opened) {
	m := s.members[id]
	m.log.Close()
	delete(s.members, id)
	s.unjournaled[id] = m.inc
	opened[id] = Opened{Err: err}
}

// closeLogs closes what an OpenStore that failed opened.
func (s *Store) closeLogs(opened map[PartitionID]Opened) {
	for _, o := range opened {
		if o.Log != nil {
			o.Log.Close()
		}
	}
}

func (s *Store) logOptions(id PartitionID, flushed *uint64, empty *partlog.Start) partlog.Options {
	lo := s.opts.LogOptions(id)
	lo.FS, lo.Flushed, lo.Empty = s.fs, flushed, empty
	lo.DirectFrameBytes = s.opts.DirectFrameBytes
	return lo
}

// Create makes a new partition's log, empty at offset 0: its incarnation
// is written in its directory, then its create record made durable, then
// the log opened, journaled. The partition must not be open in the store.
func (s *Store) Create(id PartitionID) (*partlog.Log, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.members[id]; ok {
		return nil, fmt.Errorf("journal: partition %s is open already", id)
	}
	inc, err := newIncarnation()
	if err != nil {
		return nil, err
	}
	lo := s.logOptions(id, nil, &partlog.Start{})
	// A crash before the record is durable leaves a directory whose
	// incarnation the journal does not know: recovery removes it.
	if err := writeIncarnation(s.fs, lo.Dir, inc); err != nil {
		return nil, fmt.Errorf("journal: create %s: %w", id, err)
	}
	if err := s.record(&Logged{Record: Record{Kind: Create, Part: id, Incarnation: inc}}); err != nil {
		return nil, fmt.Errorf("journal: create %s: %w", id, err)
	}
	l, err := partlog.Open(lo)
	if err != nil {
		return nil, fmt.Errorf("journal: create %s: %w", id, err)
	}
	if err := l.UseJournal(s.partition(id, inc)); err != nil {
		l.Close()
		return nil, fmt.Errorf("journal: create %s: %w", id, err)
	}
	s.members[id] = &member{id: id, inc: inc, log: l}
	delete(s.unjournaled, id)
	return l, nil
}

// Drop records durably that the partition is gone; the caller then closes
// its log (if it has not) and removes its directory. A partition the store
// does not know is not an error (it failed to open, or was dropped).
func (s *Store) Drop(id PartitionID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	inc, ok := s.unjournaled[id]
	if m := s.members[id]; m != nil {
		inc, ok = m.inc, true
	}
	if !ok {
		return nil
	}
	if err := s.record(&Logged{Record: Record{Kind: Drop, Part: id, Incarnation: inc}}); err != nil {
		return fmt.Errorf("journal: drop %s: %w", id, err)
	}
	delete(s.members, id)
	delete(s.unjournaled, id)
	return nil
}

// Detach keeps an open partition out of the journal from now on, its log
// about to be closed without a drop (its stream metadata is unreadable,
// so it will not serve): checkpoints name it unjournaled, and recovery
// opens its files as they are. The caller closes the log, which fsyncs
// them.
func (s *Store) Detach(id PartitionID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.members[id]; m != nil {
		delete(s.members, id)
		s.unjournaled[id] = m.inc
	}
}

// record appends r and waits for it to be durable.
func (s *Store) record(r *Logged) error {
	t, err := s.j.Append(r)
	if err == nil {
		err = s.j.Wait(t)
	}
	return err
}

// Checkpoint fsyncs every log's segment files up to its end and writes a
// checkpoint record saying so, then releases the journal before the
// position it was taken from. The flusher calls it. A log dropped or
// detached meanwhile is left out (its record, or its unjournaled entry,
// stands for it); a log truncated or reset meanwhile makes it take the
// snapshot again; a log closed otherwise (the process stopping) makes it
// give up, changing nothing.
func (s *Store) Checkpoint() error {
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	for range checkpointRounds {
		err := s.checkpoint()
		if !errors.Is(err, errCutMeanwhile) {
			return err
		}
	}
	return fmt.Errorf("journal: checkpoint: %w %d times in a row", errCutMeanwhile, checkpointRounds)
}

// errCutMeanwhile: a log was truncated or reset while a checkpoint
// flushed it. The end it flushed to may be below frames journalled after
// the checkpoint's position and then cut: replay would find them
// straddling it.
var errCutMeanwhile = errors.New("a log was cut while the checkpoint flushed it")

// checkpointRounds bounds the snapshots a checkpoint takes again.
const checkpointRounds = 8

func (s *Store) checkpoint() error {
	s.mu.Lock()
	// Every log's cut count, then the position: every record before the
	// position was appended before the logs' ends are read below (a log
	// hands a frame to the journal after writing it to its file), so the
	// files hold it once flushed; and a cut after the counts are read is
	// seen below.
	members := make([]*member, 0, len(s.members))
	for _, m := range s.members {
		members = append(members, m)
	}
	cuts := make([]uint64, len(members))
	for i, m := range members {
		cuts[i] = m.log.Cuts()
	}
	pos := s.j.End()
	bytes := s.j.Stats().Bytes
	s.mu.Unlock()
	if s.afterSnapshot != nil {
		s.afterSnapshot()
	}

	flushed := make([]uint64, len(members))
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	work := make(chan int)
	for range min(len(members), checkpointFsyncs) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				flushed[i], errs[i] = members[i].log.Flush()
			}
		}()
	}
	for i := range members {
		work <- i
	}
	close(work)
	wg.Wait()

	// Who is in the checkpoint is decided now: the partitions the
	// snapshot had that are still members, flushed; the unjournaled ones
	// as they are now (one detached meanwhile among them). One dropped
	// meanwhile has its drop record after pos; one created meanwhile its
	// create record.
	s.mu.Lock()
	entries := make(map[PartitionID]Entry, len(members)+len(s.unjournaled))
	for id, inc := range s.unjournaled {
		entries[id] = Entry{Incarnation: inc, Flushed: Unjournaled}
	}
	var flushes uint64
	for i, m := range members {
		if s.members[m.id] != m {
			continue
		}
		if err := errs[i]; err != nil {
			s.mu.Unlock()
			return fmt.Errorf("journal: checkpoint: partition %s: %w", m.id, err)
		}
		if m.log.Cuts() != cuts[i] {
			s.mu.Unlock()
			return errCutMeanwhile
		}
		entries[m.id] = Entry{Incarnation: m.inc, Flushed: flushed[i]}
		flushes++
	}
	s.mu.Unlock()
	if err := s.record(&Logged{Record: Record{Kind: CheckpointRecord, Base: pos}, Payload: EncodeCheckpoint(entries)}); err != nil {
		return fmt.Errorf("journal: checkpoint: %w", err)
	}
	n, err := s.j.Release(pos)
	s.stats.Checkpoints++
	s.stats.Flushes += flushes
	s.stats.Released += uint64(n)
	s.lastBytes = bytes
	if err != nil {
		return fmt.Errorf("journal: checkpoint: %w", err)
	}
	return nil
}

// checkpointFsyncs is how many segment files a checkpoint fsyncs at once.
const checkpointFsyncs = 8

// flusher checkpoints every CheckpointEvery, or sooner once
// CheckpointBytes of journal were written since the last.
func (s *Store) flusher() {
	defer close(s.done)
	tick := time.NewTicker(min(s.opts.CheckpointEvery, 250*time.Millisecond))
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		s.ckMu.Lock()
		due := s.j.Stats().Bytes-s.lastBytes >= s.opts.CheckpointBytes
		s.ckMu.Unlock()
		if !due && time.Since(last) < s.opts.CheckpointEvery {
			continue
		}
		last = time.Now()
		// A checkpoint that gives up because the process is closing the
		// logs, or because logs kept being cut, is taken again later;
		// any other failure is a failed fsync or journal.
		if err := s.Checkpoint(); err != nil && !errors.Is(err, partlog.ErrClosed) && !errors.Is(err, errCutMeanwhile) && s.opts.OnError != nil {
			s.opts.OnError(err)
		}
	}
}

// Stats returns the store's counters.
func (s *Store) Stats() StoreStats {
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	return s.stats
}

// Journal is the store's journal (for its counters).
func (s *Store) Journal() *Journal { return s.j }

// Close stops the flusher and closes the journal; the caller closes the
// logs first (each fsyncs its segment file as it closes). The journal is
// not checkpointed here (the logs are closed): the next OpenStore replays
// what came after the last checkpoint, frames the files already hold
// included. The replica checkpoints before it closes its logs.
func (s *Store) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	return s.j.Close()
}

// partition is a member's side of the journal: what partlog.Journal asks.
func (s *Store) partition(id PartitionID, inc uint64) partlog.Journal {
	return &partitionJournal{j: s.j, id: id, inc: inc}
}

type partitionJournal struct {
	j   *Journal
	id  PartitionID
	inc uint64
}

func (p *partitionJournal) Frame(h partlog.BatchHeader, frame []byte) (uint64, error) {
	t, err := p.j.Append(&Logged{Record: Record{Kind: Frame, Part: p.id, Incarnation: p.inc, Epoch: h.Epoch, Base: h.BaseOffset, End: h.End()}, Payload: frame})
	return uint64(t), err
}

func (p *partitionJournal) Truncate(to, epoch uint64) error {
	return p.wait(p.j.Append(&Logged{Record: Record{Kind: Truncate, Part: p.id, Incarnation: p.inc, Epoch: epoch, End: to}}))
}

func (p *partitionJournal) Reset(st partlog.Start) error {
	return p.wait(p.j.Append(&Logged{Record: Record{Kind: Reset, Part: p.id, Incarnation: p.inc, Base: st.Base, Rolling: st.Rolling}}))
}

func (p *partitionJournal) Written(h partlog.BatchHeader) (uint64, error) {
	t, err := p.j.Append(&Logged{Record: Record{Kind: Written, Part: p.id, Incarnation: p.inc, Epoch: h.Epoch, Base: h.BaseOffset, End: h.End(), Rolling: h.CRC}})
	return uint64(t), err
}

func (p *partitionJournal) Wait(t uint64) error { return p.j.Wait(Ticket(t)) }

func (p *partitionJournal) wait(t Ticket, err error) error {
	if err != nil {
		return err
	}
	return p.j.Wait(t)
}

// newIncarnation is a random, non-zero incarnation.
func newIncarnation() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("journal: incarnation: %w", err)
		}
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v, nil
		}
	}
}

// readIncarnation reads a partition directory's incarnation: 0 when it
// has none (or no directory), an error when the file is not one.
func readIncarnation(fsys partlog.FS, dir string) (uint64, error) {
	path := filepath.Join(dir, incarnationFile)
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read incarnation: %w", err)
	}
	defer f.Close()
	b := make([]byte, 64)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("read incarnation: %w", err)
	}
	b = b[:n]
	if len(b) == 17 && b[16] == '\n' && strings.ToLower(string(b[:16])) == string(b[:16]) {
		if v, err := strconv.ParseUint(string(b[:16]), 16, 64); err == nil && v != 0 {
			return v, nil
		}
	}
	return 0, fmt.Errorf("the file %s is not an incarnation (%q)", path, b)
}

// writeIncarnation durably writes dir's incarnation (creating dir): a
// temporary file, fsynced, renamed over, the directory and its parents
// fsynced (the directory may be new).
func writeIncarnation(fsys partlog.FS, dir string, inc uint64) error {
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, incarnationFile)
	tmp := path + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(fmt.Appendf(nil, "%016x\n", inc), 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsys.Rename(tmp, path)
	}
	for d, i := dir, 0; err == nil && i < 3; d, i = filepath.Dir(d), i+1 {
		err = fsys.SyncDir(d)
	}
	if err != nil {
		return fmt.Errorf("write incarnation of %s: %w", dir, err)
	}
	return nil
}
