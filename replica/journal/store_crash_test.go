package journal

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// crashFS is faultfs that loses power at its at-th change (a write, sync,
// truncation, creation, rename, removal or directory sync, counted from
// 1): the change is not made, the file system crashes with opts, and
// every later call fails, as a process without power makes none. at 0
// never crashes; count says how many changes were made.
type crashFS struct {
	*faultfs.FS
	opts faultfs.CrashOptions

	mu    sync.Mutex
	at    int
	count int
	dead  bool
}

var errPowerLost = errors.New("power lost")

// change counts a change and says whether it may be made.
func (c *crashFS) change() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return errPowerLost
	}
	c.count++
	if c.count == c.at {
		c.dead = true
		c.FS.Crash(c.opts)
		return errPowerLost
	}
	return nil
}

func (c *crashFS) alive() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return errPowerLost
	}
	return nil
}

func (c *crashFS) OpenFile(name string, flag int, perm os.FileMode) (partlog.File, error) {
	check := c.alive
	if flag&(os.O_CREATE|os.O_TRUNC) != 0 {
		check = c.change
	}
	if err := check(); err != nil {
		return nil, err
	}
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &crashFile{File: f, fs: c}, nil
}

func (c *crashFS) ReadDir(dir string) ([]string, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	return c.FS.ReadDir(dir)
}

func (c *crashFS) Remove(name string) error {
	if err := c.change(); err != nil {
		return err
	}
	return c.FS.Remove(name)
}

func (c *crashFS) Rename(oldpath, newpath string) error {
	if err := c.change(); err != nil {
		return err
	}
	return c.FS.Rename(oldpath, newpath)
}

func (c *crashFS) MkdirAll(dir string, perm os.FileMode) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.FS.MkdirAll(dir, perm)
}

func (c *crashFS) SyncDir(dir string) error {
	if err := c.change(); err != nil {
		return err
	}
	return c.FS.SyncDir(dir)
}

type crashFile struct {
	partlog.File
	fs *crashFS
}

func (f *crashFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.alive(); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

func (f *crashFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.change(); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *crashFile) Sync() error {
	if err := f.fs.change(); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *crashFile) Truncate(size int64) error {
	if err := f.fs.change(); err != nil {
		return err
	}
	return f.File.Truncate(size)
}

func (f *crashFile) DropCache() error {
	if err := f.fs.alive(); err != nil {
		return err
	}
	if d, ok := f.File.(interface{ DropCache() error }); ok {
		return d.DropCache()
	}
	return nil
}

// crashRun is what a scripted run left when the power went: each
// partition's model (nil: absent), and the operation under way, whose
// effect may or may not have reached the disk (after: the partition's
// model had it).
type crashRun struct {
	models  map[PartitionID]*model
	pending *PartitionID
	after   *model
	onDisk  map[PartitionID]bool
	// large and small count the frames appended at or past, and below,
	// storeOptions' DirectFrameBytes: written to a segment file only, or
	// copied into the journal.
	large, small int
}

// storeScript runs a fixed random script (by seed) of store operations
// over fsys until it ends or an operation fails (the power went).
func storeScript(seed int64, fsys partlog.FS) crashRun {
	rng := rand.New(rand.NewSource(seed))
	run := crashRun{models: map[PartitionID]*model{}, onDisk: map[PartitionID]bool{}}
	st, _, err := OpenStore(storeOptions(fsys), nil)
	if err != nil {
		return run
	}
	defer st.Close()
	logs := map[PartitionID]*partlog.Log{}
	defer func() {
		for _, l := range logs {
			l.Close()
		}
	}()
	ids := []PartitionID{{"s", 0}, {"s", 1}, {"t", 0}}
	epoch := uint64(1)
	pend := func(id PartitionID, after *model) {
		run.pending, run.after = &id, after
	}
	for step := 0; step < 60; step++ {
		id := ids[rng.Intn(len(ids))]
		l, m := logs[id], run.models[id]
		run.pending, run.after = nil, nil
		if l == nil {
			run.onDisk[id] = true
			pend(id, &model{})
			nl, err := st.Create(id)
			if err != nil {
				return run
			}
			logs[id], run.models[id] = nl, &model{}
			continue
		}
		switch r := rng.Intn(100); {
		case r < 55:
			recs := make([]partlog.Record, 1+rng.Intn(4))
			for i := range recs {
				recs[i] = partlog.Record{Key: fmt.Appendf(nil, "k%d", step), Value: make([]byte, rng.Intn(400))}
			}
			f, err := partlog.AppendBatch(nil, epoch, l.NextOffset(), recs)
			if err != nil {
				panic(err)
			}
			end := l.NextOffset() + uint64(len(recs))
			after := *m
			after.frames, after.ends = append(after.frames[:len(after.frames):len(after.frames)], f), append(after.ends[:len(after.ends):len(after.ends)], end)
			pend(id, &after)
			if err := l.Append(f); err != nil {
				return run
			}
			*m = after
			if len(f) >= storeOptions(nil).DirectFrameBytes {
				run.large++
			} else {
				run.small++
			}
		case r < 75:
			if err := l.Sync(); err != nil {
				return run
			}
			m.durable = l.DurableOffset()
		case r < 83:
			if err := st.Checkpoint(); err != nil {
				return run
			}
		case r < 90 && len(m.ends) > 0:
			k := rng.Intn(len(m.ends) + 1)
			to := m.start
			if k > 0 {
				to = m.ends[k-1]
			}
			after := *m
			after.truncate(to)
			pend(id, &after)
			if err := l.Truncate(to); err != nil {
				return run
			}
			*m = after
			epoch++
		case r < 94:
			base := l.NextOffset() + 1 + uint64(rng.Intn(50))
			after := model{start: base, durable: base}
			pend(id, &after)
			if err := l.Reset(base, 7); err != nil {
				return run
			}
			*m = after
		case r < 97:
			pend(id, nil)
			if err := st.Drop(id); err != nil {
				return run
			}
			delete(logs, id)
			delete(run.models, id)
			if err := l.Close(); err != nil {
				return run
			}
		default:
			// A checkpoint with the frames of every partition durable.
			for _, l := range logs {
				if err := l.Sync(); err != nil {
					return run
				}
			}
			for id, l := range logs {
				run.models[id].durable = l.DurableOffset()
			}
		}
	}
	return run
}

// Power lost at every change a scripted run makes to the disk, the
// journal's writer and its preparation of segments running alongside:
// after recovery each partition holds everything acknowledged to it and
// nothing it was not given, as before the operation under way or as after
// it; dropped partitions are gone and created ones there, empty, or gone.
func TestStorePowerLossAtEveryChange(t *testing.T) {
	seeds := 4
	if testing.Short() {
		seeds = 1
	}
	for seed := range int64(seeds) {
		clean := &crashFS{FS: faultfs.New()}
		if run := storeScript(seed, clean); run.large == 0 || run.small == 0 {
			t.Fatalf("seed %d: %d large frames and %d small: the script must append both kinds", seed, run.large, run.small)
		}
		total := clean.count
		for at := 1; at <= total+10; at++ {
			rng := rand.New(rand.NewSource(seed*100_000 + int64(at)))
			opts := faultfs.CrashOptions{KeepUnsynced: []int{0, -1, rng.Intn(300)}[rng.Intn(3)], ZeroFill: rng.Intn(4) == 0}
			fsys := &crashFS{FS: faultfs.New(), at: at, opts: opts}
			run := storeScript(seed, fsys)
			if !fsys.dead {
				continue // the writer's goroutines made fewer changes this time
			}
			if err := checkRecovered(fsys.FS, run); err != nil {
				t.Fatalf("seed %d, power lost at change %d of %d (%+v): %v", seed, at, total, opts, err)
			}
		}
	}
}

// checkRecovered opens the store over what the power loss left and checks
// it against the run's models.
func checkRecovered(fsys *faultfs.FS, run crashRun) error {
	var disk []PartitionID
	for id := range run.onDisk {
		if _, err := fsys.ReadDir(partDir(id)); err == nil {
			disk = append(disk, id) // as the server lists directories
		}
	}
	st, opened, err := OpenStore(storeOptions(fsys), disk)
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	defer st.Close()
	defer func() {
		for _, o := range opened {
			if o.Log != nil {
				o.Log.Close()
			}
		}
	}()
	ids := map[PartitionID]bool{}
	for id := range opened {
		ids[id] = true
	}
	for id := range run.models {
		ids[id] = true
	}
	for id := range ids {
		o, ok := opened[id]
		if ok && o.Err != nil {
			return fmt.Errorf("partition %s: %w", id, o.Err)
		}
		present := ok && o.Log != nil
		cands := []*model{run.models[id]}
		if run.pending != nil && *run.pending == id {
			cands = append(cands, run.after)
		}
		var why []string
		for _, m := range cands {
			var err error
			switch {
			case m == nil && present:
				err = errors.New("it was dropped (or never created), and it opened")
			case m != nil && !present:
				err = errors.New("it is gone")
			case m != nil:
				err = m.check(o.Log)
			}
			if err == nil {
				why = nil
				break
			}
			why = append(why, err.Error())
		}
		if why != nil {
			return fmt.Errorf("partition %s: %s", id, strings.Join(why, "; or "))
		}
	}
	return nil
}

// crashNow loses the power now, if it is not lost yet.
func (c *crashFS) crashNow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dead {
		c.dead = true
		c.FS.Crash(c.opts)
	}
}

// Power lost while partitions append and sync concurrently and the
// flusher checkpoints every millisecond: frames appended while a
// checkpoint flushes are replayed, never taken as flushed. Each partition
// holds every frame acknowledged to it.
func TestStorePowerLossUnderConcurrentLoad(t *testing.T) {
	seeds := 30
	if testing.Short() {
		seeds = 8
	}
	for seed := range int64(seeds) {
		rng := rand.New(rand.NewSource(seed))
		fsys := &crashFS{FS: faultfs.New(), opts: faultfs.CrashOptions{KeepUnsynced: []int{0, -1, rng.Intn(300)}[rng.Intn(3)]}}
		crashAfter := 300 + rng.Intn(3000) // changes after the partitions are created
		opts := storeOptions(fsys)
		opts.CheckpointEvery = time.Millisecond
		st, _, err := OpenStore(opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		run := crashRun{models: map[PartitionID]*model{}, onDisk: map[PartitionID]bool{}}
		var wg sync.WaitGroup
		for p := range uint32(4) {
			id := PartitionID{"s", p}
			run.onDisk[id] = true
			l, err := st.Create(id)
			if err != nil {
				t.Fatal(err)
			}
			m := &model{}
			run.models[id] = m
			if p == 3 {
				// The flusher checkpoints all along: on a busy machine
				// the creations alone can make hundreds of changes.
				fsys.mu.Lock()
				fsys.at = fsys.count + crashAfter
				fsys.mu.Unlock()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer l.Close()
				for i := 0; i < 400; i++ {
					// Every fourth frame is large: written to its
					// segment file only, its Sync recording flushed
					// while checkpoints take their positions.
					size := 50 + i%300
					if i%4 == 3 {
						size += storeOptions(nil).DirectFrameBytes
					}
					f, err := partlog.AppendBatch(nil, 1, l.NextOffset(), []partlog.Record{{Value: make([]byte, size)}})
					if err != nil {
						panic(err)
					}
					m.frames, m.ends = append(m.frames, f), append(m.ends, l.NextOffset()+1)
					if l.Append(f) != nil {
						return
					}
					if i%3 == 2 {
						if l.Sync() != nil {
							return
						}
						m.durable = l.DurableOffset()
					}
				}
			}()
		}
		wg.Wait()
		fsys.crashNow()
		st.Close()
		if err := checkRecovered(fsys.FS, run); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}
