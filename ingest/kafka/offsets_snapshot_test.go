package kafka

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/replica/server"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// offsetsModel is what a run of commits and deletions must leave: per
// group, the newest offset committed for each partition.
type offsetsModel map[string]map[groups.TopicPartition]groups.Committed

func (m offsetsModel) commit(t *testing.T, ctx context.Context, st *groups.StreamOffsets, group string, partition int32, offset int64, metadata string) {
	t.Helper()
	tp := groups.TopicPartition{Topic: "s", Partition: partition}
	c := groups.Committed{Offset: offset, LeaderEpoch: -1, Metadata: metadata, At: offset}
	errs, err := st.Commit(ctx, group, []groups.Commit{{TopicPartition: tp, Committed: c}})
	if err != nil {
		t.Error(err)
		return
	}
	if errs[0] != nil {
		t.Error(errs[0])
		return
	}
	if m[group] == nil {
		m[group] = map[groups.TopicPartition]groups.Committed{}
	}
	m[group][tp] = c
}

func (m offsetsModel) check(t *testing.T, got map[string]map[groups.TopicPartition]groups.Committed) {
	t.Helper()
	same := maps.EqualFunc(map[string]map[groups.TopicPartition]groups.Committed(m), got, func(a, b map[groups.TopicPartition]groups.Committed) bool { return maps.Equal(a, b) })
	if !same {
		for g, offs := range m {
			if !maps.Equal(offs, got[g]) {
				t.Errorf("group %s: loaded %v, committed %v", g, got[g], offs)
			}
		}
		for g := range got {
			if m[g] == nil {
				t.Errorf("group %s loaded (%v) but never committed or deleted since", g, got[g])
			}
		}
	}
}

func snapshotHoldOf(t *testing.T, c *cluster) (uint64, bool) {
	t.Helper()
	resp, err := c.ing.ListConsumers(context.Background(), &catenapb.ListConsumersRequest{Stream: groups.DefaultOffsetsStream})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.GetPartitions() {
		for _, h := range p.GetHolds() {
			if h.GetConsumer() == groups.SnapshotHold {
				return h.GetOffset(), true
			}
		}
	}
	return 0, false
}

// TestALoadStartsFromTheNewestSnapshot: every commit adds a record to the
// offsets stream, and a coordinator's start read all of them, for ever
// more. After a snapshot, a new coordinator reads the snapshot and what
// was stored after it, and has every group's offsets exactly (deletions,
// groups deleted and committed again, and offsets moved back included).
func TestALoadStartsFromTheNewestSnapshot(t *testing.T) {
	c := startCluster(t, 2)
	c.produceN(t, 2, 100)
	ctx := ctxT(t, 120*time.Second)
	st := &groups.StreamOffsets{Ingest: c.ing, SnapshotEvery: 100, Logger: testr.New(t)}
	if _, err := st.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// Another node, loaded before the snapshot, reads on past it.
	other := &groups.StreamOffsets{Ingest: c.ing, Logger: testr.New(t)}
	if _, err := other.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if hold, ok := snapshotHoldOf(t, c); !ok || hold != 0 {
		t.Fatalf("after the first load the snapshot hold is %d (held: %v), want 0: until a snapshot, retention must keep every record", hold, ok)
	}
	model := offsetsModel{}
	for i := range 250 {
		model.commit(t, ctx, st, fmt.Sprintf("g%d", i%5), int32(i%2), int64((i*37)%100), "")
		if i == 200 {
			if err := st.Delete(ctx, "g3", []string{"s"}); err != nil {
				t.Fatal(err)
			}
			delete(model, "g3")
		}
	}
	if t.Failed() {
		return
	}
	if wrote, err := st.Compact(ctx); err != nil || !wrote {
		t.Fatalf("Compact after 250 records with SnapshotEvery 100: wrote %v, %v", wrote, err)
	}
	if wrote, err := st.Compact(ctx); err != nil || wrote {
		t.Fatalf("Compact right after a snapshot: wrote %v, %v; want nothing written", wrote, err)
	}
	for i := range 10 {
		model.commit(t, ctx, st, fmt.Sprintf("g%d", i%5), 0, int64(i), "after")
	}

	fresh := &groups.StreamOffsets{Ingest: c.ing, Logger: testr.New(t)}
	got, err := fresh.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	model.check(t, got)
	stats := fresh.LastLoad()
	hold, _ := snapshotHoldOf(t, c)
	if !stats.Snapshot || stats.SnapshotAsOf != hold || stats.From != hold {
		t.Fatalf("the load %+v did not start from the snapshot at the hold (%d)", stats, hold)
	}
	// 10 commits and the snapshot's one part (the holds of 251 commits
	// and a deletion are not records of the stream).
	if stats.Records != 11 {
		t.Fatalf("the load read %d records from the snapshot on, want 11", stats.Records)
	}
	got, err = other.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	model.check(t, got)

	// Two nodes that both compact at once (a membership change) write
	// two snapshots; either serves.
	for i := range 150 {
		model.commit(t, ctx, st, fmt.Sprintf("g%d", i%7), int32(i%2), int64(i%100), "twice")
	}
	var wg sync.WaitGroup
	for _, n := range []*groups.StreamOffsets{st, other} {
		n.SnapshotEvery = 100
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.Compact(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	last := &groups.StreamOffsets{Ingest: c.ing, Logger: testr.New(t)}
	if got, err = last.Load(ctx); err != nil {
		t.Fatal(err)
	}
	model.check(t, got)
	if stats := last.LastLoad(); !stats.Snapshot || stats.SnapshotAsOf <= hold {
		t.Fatalf("after two nodes compacted, the load %+v did not start from a newer snapshot than %d", stats, hold)
	}
}

// TestGroupOffsetsSurviveRetentionOfTheOffsetsStream: the offsets stream
// given retention (records older than a millisecond, segments of 1 MiB)
// trims every segment below its snapshot hold, while commits go on
// beside the snapshots; a new coordinator still has every group's
// newest offsets.
func TestGroupOffsetsSurviveRetentionOfTheOffsetsStream(t *testing.T) {
	c := startClusterWith(t, 2, clusterOptions{replica: func(o *server.Options) { o.RetentionPeriod = 100 * time.Millisecond }})
	c.produceN(t, 2, 100)
	c.configure(groups.DefaultOffsetsStream, &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, RetentionMs: 1, SegmentBytes: 1 << 20})
	ctx := ctxT(t, 180*time.Second)
	st := &groups.StreamOffsets{Ingest: c.ing, SnapshotEvery: 150, Logger: testr.New(t)}
	if _, err := st.Load(ctx); err != nil {
		t.Fatal(err)
	}
	// Records of about 3 KiB: a segment of 1 MiB holds about 330.
	metadata := strings.Repeat("m", 3000)
	beside := offsetsModel{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopBeside := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopBeside()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			beside.commit(t, ctx, st, fmt.Sprintf("beside%d", i%4), int32(i%2), int64(i%100), metadata)
		}
	}()
	model := offsetsModel{}
	for i := range 700 {
		model.commit(t, ctx, st, fmt.Sprintf("g%d", i%4), int32(i%2), int64((i*31)%100), metadata)
		if i%100 == 99 {
			if _, err := st.Compact(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	// The last snapshot too is written while commits go on beside it:
	// the load applies those stored from its asOf on over it.
	for {
		wrote, err := st.Compact(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		if wrote {
			break
		}
		model.commit(t, ctx, st, "g0", 0, 1, metadata)
	}
	stopBeside()
	if t.Failed() {
		return
	}
	hold, ok := snapshotHoldOf(t, c)
	if !ok || hold == 0 {
		t.Fatalf("no snapshot moved the hold (%d, held: %v)", hold, ok)
	}
	var start uint64
	waitFor(t, 30*time.Second, "retention to trim the offsets stream", func() bool {
		resp, err := c.ing.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: groups.DefaultOffsetsStream, Spec: catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST})
		if err != nil {
			t.Fatal(err)
		}
		start = resp.GetOffset()
		return start > 0
	})
	if start > hold {
		t.Fatalf("retention trimmed to %d, past the snapshot hold at %d", start, hold)
	}
	maps.Copy(model, beside)
	fresh := &groups.StreamOffsets{Ingest: c.ing, Logger: testr.New(t)}
	got, err := fresh.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	model.check(t, got)
	if stats := fresh.LastLoad(); !stats.Snapshot {
		t.Fatalf("the load %+v used no snapshot", stats)
	}
	t.Logf("stream trimmed to %d, snapshot hold at %d; the load read %+v", start, hold, fresh.LastLoad())
}

// TestALoadTakesTheSnapshotAtItsHoldAndTheCommitsAfterIt walks the load
// through a stream written by hand: commits, a snapshot in two parts
// with commits stored between its asOf and its last part, a snapshot
// never completed, and commits after. The snapshot's contents differ from
// what the commits before its asOf make, so the result tells which was
// read.
func TestALoadTakesTheSnapshotAtItsHoldAndTheCommitsAfterIt(t *testing.T) {
	c := startCluster(t, 2)
	ctx := ctxT(t, 60*time.Second)
	commit := func(g string, p, o int) string {
		return fmt.Sprintf(`{"v":1,"group":%q,"offsets":[{"topic":"s","partition":%d,"offset":%d,"leaderEpoch":-1,"at":0}]}`, g, p, o)
	}
	part := func(id string, asOf, i, n int, g string, p, o int) string {
		return fmt.Sprintf(`{"v":2,"snapshot":{"id":%q,"asOf":%d,"part":%d,"parts":%d},"groups":[{"group":%q,"offsets":[{"topic":"s","partition":%d,"offset":%d,"leaderEpoch":-1,"at":0}]}]}`, id, asOf, i, n, g, p, o)
	}
	records := []string{
		commit("A", 0, 1),              // 0
		commit("B", 0, 1),              // 1
		commit("A", 0, 2),              // 2
		part("X", 3, 0, 2, "S", 0, 42), // 3: the state before offset 3, in two parts
		commit("B", 0, 5),              // 4: stored while X was written
		commit("S", 1, 7),              // 5
		part("Y", 6, 0, 2, "Z", 0, 1),  // 6: a snapshot never completed
		part("X", 3, 1, 2, "T", 0, 9),  // 7: X complete
		commit("A", 1, 3),              // 8
	}
	p := uint32(0)
	for i, v := range records {
		resp, err := c.ing.Produce(ctx, &catenapb.ProduceRequest{Stream: groups.DefaultOffsetsStream, Records: []*catenapb.ProduceRecord{{Value: []byte(v), Partition: &p}}})
		if err != nil || resp.GetResults()[0].GetErrorCode() != 0 || resp.GetResults()[0].GetOffset() != uint64(i) {
			t.Fatalf("record %d: %v %v", i, resp, err)
		}
	}
	tp := func(p int32) groups.TopicPartition { return groups.TopicPartition{Topic: "s", Partition: p} }
	at := func(o int64) groups.Committed { return groups.Committed{Offset: o, LeaderEpoch: -1} }
	replayed := offsetsModel{"A": {tp(0): at(2), tp(1): at(3)}, "B": {tp(0): at(5)}, "S": {tp(1): at(7)}}
	fromX := offsetsModel{"S": {tp(0): at(42), tp(1): at(7)}, "T": {tp(0): at(9)}, "B": {tp(0): at(5)}, "A": {tp(1): at(3)}}
	for _, tc := range []struct {
		hold     uint64
		want     offsetsModel
		snapshot bool
	}{
		// At the stream's first record: every commit, no snapshot.
		{0, replayed, false},
		// At X's asOf: X, then the commits from 3 on.
		{3, fromX, true},
		// Past X's asOf, where only Y (never complete) begins: the
		// whole stream again.
		{4, replayed, false},
	} {
		if _, err := c.ing.CommitConsumerOffset(ctx, &catenapb.CommitConsumerOffsetRequest{Stream: groups.DefaultOffsetsStream, Consumer: groups.SnapshotHold, Offset: tc.hold}); err != nil {
			t.Fatal(err)
		}
		st := &groups.StreamOffsets{Ingest: c.ing, Logger: testr.New(t)}
		got, err := st.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tc.want.check(t, got)
		if stats := st.LastLoad(); stats.Snapshot != tc.snapshot || (tc.snapshot && stats.SnapshotAsOf != 3) {
			t.Errorf("hold at %d: load %+v, want snapshot %v", tc.hold, stats, tc.snapshot)
		}
	}
}
