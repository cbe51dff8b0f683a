package server

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestDedupSnapshotRoundTrip(t *testing.T) {
	tb := newDedupTable()
	for seq := uint64(1); seq <= 50; seq++ {
		tb.add(7, seq, 100+seq) // one run
	}
	for seq := uint64(1); seq <= 10; seq++ {
		tb.add(9, 2*seq, 200+seq) // a run per record
	}
	tb.add(11, 5, 300)
	tb.producers[11].minSeq = 3
	want := dedupSnapshot{offset: 400, frameEpoch: 3, frameCRC: 0xdeadbeef, table: tb}
	b := encodeDedupSnapshot(want)
	got, err := decodeDedupSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
	}{
		{"a flipped bit", func(b []byte) []byte { b[40] ^= 1; return b }},
		{"cut short", func(b []byte) []byte { return b[:len(b)-9] }},
		{"empty", func([]byte) []byte { return nil }},
		{"another version", func(b []byte) []byte {
			b[4] = 9
			return reseal(b)
		}},
		{"a run past the snapshot's offset", func([]byte) []byte {
			bad := tb.clone()
			bad.producers[7].runs[0].offset = 390
			return encodeDedupSnapshot(dedupSnapshot{offset: 400, table: bad})
		}},
		{"runs out of order", func([]byte) []byte {
			bad := tb.clone()
			r := bad.producers[9].runs
			r[0], r[1] = r[1], r[0]
			return encodeDedupSnapshot(dedupSnapshot{offset: 400, table: bad})
		}},
	} {
		if _, err := decodeDedupSnapshot(tc.mod(append([]byte(nil), b...))); err == nil {
			t.Errorf("%s: decoded", tc.name)
		}
	}
}

// reseal recomputes a snapshot's checksum after a test changed it.
func reseal(b []byte) []byte { return sealDedupSnapshot(b[:len(b)-4]) }

// TestARestartReadsBackOnlyWhatFollowsTheDedupSnapshot: a replica that
// crashed after a snapshot rebuilds its de-duplication table from the
// snapshot and the records after it, and still recognises retries of
// records on both sides of it.
func TestARestartReadsBackOnlyWhatFollowsTheDedupSnapshot(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := startNodeAt(t, "a", dir, nil)
	configure(t, 1, a)
	first, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 20)})
	if err != nil {
		t.Fatal(err)
	}
	p := a.srv.partitions[partKey{"s", 0}]
	// The periodic round waits for the log to move further than this.
	if err := p.saveDedup(dedupSnapshotRecords); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p.dir, dedupSnapshotFile)); !os.IsNotExist(err) {
		t.Fatalf("a snapshot after 20 records in the periodic round: %v", err)
	}
	if err := p.saveDedup(1); err != nil {
		t.Fatal(err)
	}
	second, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, 1, 10)})
	if err != nil {
		t.Fatal(err)
	}
	// The crash image: the files as the running replica left them (its
	// appends are durable once answered), without the close's snapshot.
	crashed := t.TempDir()
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	stopNode(a)

	b := startNodeAt(t, "a", crashed, nil)
	pb := b.srv.partitions[partKey{"s", 0}]
	if pb.dedupSaved != 20 {
		t.Fatalf("the restarted replica's table is from offset %d, want the snapshot's 20", pb.dedupSaved)
	}
	for _, tc := range []struct {
		name string
		recs []*catenapb.AppendRecord
		want *catenapb.AppendResponse
	}{
		{"a retry of records in the snapshot", records(1, 1, 20), first},
		{"a retry of records after it", records(2, 1, 10), second},
	} {
		// A sole member: the restarted replica serves at once.
		resp, err := b.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: tc.recs})
		if err != nil {
			t.Fatal(err)
		}
		for i, off := range resp.GetOffsets() {
			if !resp.GetDuplicate()[i] || off != tc.want.GetOffsets()[i] {
				t.Fatalf("%s: record %d at %d (duplicate %v), want the original %d", tc.name, i, off, resp.GetDuplicate()[i], tc.want.GetOffsets()[i])
			}
		}
	}
	if end := status0(t, b).GetLogEnd(); end != 30 {
		t.Fatalf("log end %d after the retries, want 30", end)
	}
}

// TestASnapshotOfAnotherLogIsNotUsed: the snapshot names the frame that
// ended at its offset; a log cut below it and written again differently,
// or cut below it and not written, or trimmed past it, reads back instead.
func TestASnapshotOfAnotherLogIsNotUsed(t *testing.T) {
	l, err := partlog.Open(partlog.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	appendFrame := func(epoch, base uint64, n int, tag string) {
		t.Helper()
		recs := make([]partlog.Record, n)
		for i := range recs {
			recs[i] = partlog.Record{Value: []byte(tag), ProducerID: 1, Sequence: base + uint64(i) + 1}
		}
		fr, err := partlog.AppendBatch(nil, epoch, base, recs)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Append(fr); err != nil {
			t.Fatal(err)
		}
	}
	appendFrame(1, 0, 5, "x")
	appendFrame(1, 5, 5, "x")
	frames, err := l.ReadFrames(9, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	h, err := partlog.DecodeHeader(frames[0])
	if err != nil {
		t.Fatal(err)
	}
	s := dedupSnapshot{offset: 10, frameEpoch: h.Epoch, frameCRC: h.CRC, table: newDedupTable()}
	if err := s.fitsLog(l); err != nil {
		t.Fatalf("the snapshot of this log: %v", err)
	}
	if err := (dedupSnapshot{offset: 10, frameEpoch: h.Epoch, frameCRC: h.CRC + 1}).fitsLog(l); err == nil {
		t.Error("a snapshot naming another frame fits")
	}
	if err := (dedupSnapshot{offset: 7, frameEpoch: h.Epoch, frameCRC: h.CRC}).fitsLog(l); err == nil {
		t.Error("a snapshot inside a frame fits")
	}
	if err := l.Truncate(5); err != nil {
		t.Fatal(err)
	}
	if err := s.fitsLog(l); err == nil {
		t.Error("a snapshot past the cut log's end fits")
	}
	appendFrame(2, 5, 5, "y")
	if err := s.fitsLog(l); err == nil {
		t.Error("a snapshot of the frames a cut removed fits the frames written since")
	}
	if err := (dedupSnapshot{offset: 0}).fitsLog(l); err == nil {
		t.Error("a snapshot at the log start fits")
	}
}

// TestADedupSnapshotCoversDurableRecordsOnly: records not yet fsynced are
// left out of the snapshot, so that one a power cut outlives never names
// records the log lost (a sole member goes on at the same epoch, and could
// come to end a byte-identical retried frame at the same offset after
// other records filled the gap below it).
func TestADedupSnapshotCoversDurableRecordsOnly(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, "a", nil)
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_INTERVAL, FsyncIntervalMs: 60_000}
	if _, err := a.rc.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Epoch: 1, Members: members(a), Config: cfg}); err != nil {
		t.Fatal(err)
	}
	p := a.srv.partitions[partKey{"s", 0}]
	snapshotAt := func() (uint64, bool) {
		t.Helper()
		if err := p.saveDedup(1); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(p.dir, dedupSnapshotFile))
		if os.IsNotExist(err) {
			return 0, false
		}
		s, err := decodeDedupSnapshot(b)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range s.table.producers {
			for _, r := range w.runs {
				if r.offset+r.n > s.offset {
					t.Fatalf("the snapshot at %d holds records up to %d", s.offset, r.offset+r.n)
				}
			}
		}
		return s.offset, true
	}
	if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := p.log.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, 1, 10)}); err != nil {
		t.Fatal(err)
	}
	if off, ok := snapshotAt(); !ok || off != 10 {
		t.Fatalf("snapshot at %d (written %v), want the durable end 10 with producer 2's records past it left out", off, ok)
	}
	if err := p.log.Sync(); err != nil {
		t.Fatal(err)
	}
	if off, _ := snapshotAt(); off != 20 {
		t.Fatalf("snapshot at %d after the fsync, want 20", off)
	}
}
