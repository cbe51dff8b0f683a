package server

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/catena-streams/catena/internal/heard"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// stuckSyncFS is the real file system, but while stuck is set, writes and
// fsyncs of files under dir wait until release is closed: one partition
// whose disk writes hang while the process goes on serving the others
// (writes too: with a journal, the partition's fsyncs are not on its
// appends' path).
type stuckSyncFS struct {
	partlog.OSFS
	dir     string
	stuck   atomic.Bool
	release chan struct{}
}

func (f *stuckSyncFS) OpenFile(name string, flag int, perm os.FileMode) (partlog.File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil || !strings.HasPrefix(name, f.dir) {
		return file, err
	}
	return &stuckSyncFile{File: file, fs: f}, nil
}

type stuckSyncFile struct {
	partlog.File
	fs *stuckSyncFS
}

func (f *stuckSyncFile) WriteAt(b []byte, off int64) (int, error) {
	if f.fs.stuck.Load() {
		<-f.fs.release
	}
	return f.File.WriteAt(b, off)
}

func (f *stuckSyncFile) Sync() error {
	if f.fs.stuck.Load() {
		<-f.fs.release
	}
	return f.File.Sync()
}

// TestASuccessorThatAcknowledgesOtherPartitionsIsNotStalled: a link's
// stall is evidence that the successor's process cannot be reached (the
// master removes the successor from the chain for it: a link that carries
// nothing), and a process that acknowledges other partitions' records
// meanwhile is reachable. On a machine loaded past its capacity one
// partition's acknowledgement waits for seconds while the others flow;
// counted per partition, that removed live members from chains under
// load, for nothing. Once the successor acknowledges nothing at all, the
// stall shows again.
func TestASuccessorThatAcknowledgesOtherPartitionsIsNotStalled(t *testing.T) {
	a := startNode(t, "a", nil)
	b := &node{id: "b", fatal: make(chan error, 4)}
	dataDir := t.TempDir()
	fs := &stuckSyncFS{dir: dataDir + "/streams/s/00000/", release: make(chan struct{})}
	startWith(t, b, dataDir, Options{FS: fs})
	t.Cleanup(func() { close(fs.release) }) // before b stops (cleanups run last first)
	ctx := context.Background()
	for part := uint32(0); part < 2; part++ {
		req := &catenapb.ConfigureRequest{Stream: "s", Partition: part, Epoch: 1, Config: &catenapb.StreamConfig{Partitions: 2, Durability: catenapb.Durability_DURABILITY_FSYNC}, Members: members(a, b)}
		for _, n := range []*node{b, a} {
			if _, err := client(t, n.addr).Configure(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	seq := uint64(1)
	appendTo := func(ctx context.Context, part uint32) error {
		recs := records(1, seq, 1)
		seq++
		_, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Partition: part, Epoch: 1, Records: recs})
		return err
	}
	for part := uint32(0); part < 2; part++ {
		if err := appendTo(ctx, part); err != nil {
			t.Fatal(err)
		}
	}
	// Partition 0's fsyncs hang at b; partition 1 goes on.
	fs.stuck.Store(true)
	stuck := make(chan error, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stuckReq := &catenapb.AppendRequest{Stream: "s", Partition: 0, Epoch: 1, Records: records(1, seq, 1)}
	seq++
	ac := client(t, a.addr)
	go func() {
		_, err := ac.Append(sctx, stuckReq)
		stuck <- err
	}()
	worst := uint64(0)
	for deadline := time.Now().Add(800 * time.Millisecond); time.Now().Before(deadline); {
		if err := appendTo(ctx, 1); err != nil {
			t.Fatalf("append to partition 1 while partition 0 hangs at the successor: %v", err)
		}
		worst = max(worst, status0(t, a).GetSuccessorStalledMs())
	}
	if worst >= 300 {
		t.Fatalf("partition 0's link reported stalled for %d ms while the successor acknowledged partition 1 throughout", worst)
	}
	select {
	case err := <-stuck:
		t.Fatalf("the append to partition 0 completed though its fsync at the successor hangs: %v", err)
	default:
	}
	// Nothing else is acknowledged now: the stall shows.
	eventually(t, 5*time.Second, func() error {
		if ms := status0(t, a).GetSuccessorStalledMs(); ms < 300 {
			return fmt.Errorf("stalled %d ms, want 300 ms or more once the successor acknowledges nothing", ms)
		}
		return nil
	})
}

// TestAWedgedPartitionAtALiveSuccessorIsStalledAfterTheGrace: other
// partitions' acknowledgements hide one partition's stall for stallGrace at
// most, so that a partition whose writes hang at a live successor is still
// cut, later; a silent successor shows from the start.
func TestAWedgedPartitionAtALiveSuccessorIsStalledAfterTheGrace(t *testing.T) {
	p := &partition{srv: &Server{successors: heard.New()}}
	const addr = "successor:1"
	for _, tc := range []struct {
		name           string
		owed           time.Duration
		heard          bool
		atLeast, below time.Duration
	}{
		{"silent successor", 2 * time.Second, false, 2 * time.Second, 3 * time.Second},
		{"live successor, within the grace", 2 * time.Second, true, 0, time.Second},
		{"live successor, past the grace", stallGrace + 3*time.Second, true, 3 * time.Second, 4 * time.Second},
	} {
		p.srv.successors = heard.New()
		if tc.heard {
			p.srv.successors.Mark(addr)
		}
		p.stalledSince = time.Now().Add(-tc.owed)
		if got := p.successorStalled(addr); got < tc.atLeast || got >= tc.below {
			t.Errorf("%s: stalled %v, want [%v, %v)", tc.name, got, tc.atLeast, tc.below)
		}
	}
}
