package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// retentionConfig trims everything but the active segment unless held:
// 1 MiB segments, a 1-byte soft limit, and the given hard byte limit.
func retentionConfig(hardBytes int64) *catenapb.StreamConfig {
	return &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC,
		SegmentBytes: 1 << 20, RetentionBytes: 1, HardRetentionBytes: hardBytes}
}

func configureWith(t *testing.T, cfg *catenapb.StreamConfig, epoch uint64, chain ...*node) {
	t.Helper()
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: epoch, Members: members(chain...), Config: cfg}
	for i := len(chain) - 1; i >= 0; i-- {
		if _, err := client(t, chain[i].addr).Configure(context.Background(), req); err != nil {
			t.Fatalf("configure %s: %v", chain[i].id, err)
		}
	}
}

// appendLarge appends n records of 300 KiB, one per batch: about four to a
// 1 MiB segment.
func appendLarge(t *testing.T, head *node, epoch uint64, n int) {
	t.Helper()
	c := client(t, head.addr)
	for i := range n {
		rec := &catenapb.AppendRecord{Key: []byte(fmt.Sprint("k", i)), Value: make([]byte, 300<<10)}
		if _, err := c.Append(context.Background(), &catenapb.AppendRequest{Stream: "s", Epoch: epoch, Records: []*catenapb.AppendRecord{rec}}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
}

func hold(t *testing.T, n *node, consumer string, offset uint64) *catenapb.PartitionStatus {
	t.Helper()
	st, err := client(t, n.addr).HoldRetention(context.Background(), &catenapb.HoldRetentionRequest{Stream: "s", Consumer: consumer, Offset: offset})
	if err != nil {
		t.Fatalf("hold %s@%d on %s: %v", consumer, offset, n.id, err)
	}
	return st
}

func release(t *testing.T, n *node, consumer string) []uint32 {
	t.Helper()
	resp, err := client(t, n.addr).ReleaseRetention(context.Background(), &catenapb.ReleaseRetentionRequest{Stream: "s", Consumer: consumer})
	if err != nil {
		t.Fatalf("release %s on %s: %v", consumer, n.id, err)
	}
	return resp.GetReleased()
}

// holdsOf renders a status's holds as consumer@offset.
func holdsOf(st *catenapb.PartitionStatus) []string {
	out := []string{}
	for _, h := range st.GetHolds() {
		out = append(out, fmt.Sprintf("%s@%d", h.GetConsumer(), h.GetOffset()))
	}
	return out
}

// restart stops n and starts a replica of the same id on its data dir.
func restart(t *testing.T, n *node, dir string) *node {
	t.Helper()
	n.g.Stop()
	n.srv.Close()
	return startNodeAt(t, n.id, dir, nil)
}

func TestHoldsPersistAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	a := startNodeAt(t, "a", dir, nil)
	configure(t, 1, a)
	hold(t, a, "ns/agg-one", 5)
	hold(t, a, "b", 3)
	// Set, not max: a consumer restored from an older checkpoint moves back.
	st := hold(t, a, "ns/agg-one", 2)
	if got, want := holdsOf(st), []string{"b@3", "ns/agg-one@2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("holds %v, want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(a.srv.partitionDir("s", 0), holdsFile)); err != nil {
		t.Fatalf("holds file: %v", err)
	}

	a = restart(t, a, dir)
	if got, want := holdsOf(status0(t, a)), []string{"b@3", "ns/agg-one@2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after restart: holds %v, want %v", got, want)
	}
	if got := release(t, a, "b"); !reflect.DeepEqual(got, []uint32{0}) {
		t.Fatalf("release b released %v, want [0]", got)
	}
	if got := release(t, a, "b"); len(got) != 0 {
		t.Fatalf("releasing again released %v, want nothing", got)
	}
	a = restart(t, a, dir)
	if got, want := holdsOf(status0(t, a)), []string{"ns/agg-one@2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after release and restart: holds %v, want %v", got, want)
	}
}

func TestRetentionKeepsWhatTheLowestHoldNeeds(t *testing.T) {
	a := startNode(t, "a", nil)
	configureWith(t, retentionConfig(0), 1, a)
	appendLarge(t, a, 1, 16)
	hold(t, a, "low", 5)
	hold(t, a, "high", 9)

	a.srv.enforceRetention()
	st := status0(t, a)
	if st.GetLogStart() == 0 || st.GetLogStart() > 5 {
		t.Fatalf("log start %d with the lowest hold at 5: want the segments wholly below 5 trimmed, no more", st.GetLogStart())
	}
	// Again: nothing more goes while the holds stay.
	a.srv.enforceRetention()
	if again := status0(t, a); again.GetLogStart() != st.GetLogStart() {
		t.Fatalf("log start moved from %d to %d with the holds unchanged", st.GetLogStart(), again.GetLogStart())
	}

	// Releasing the lowest lets retention proceed up to the next hold.
	release(t, a, "low")
	a.srv.enforceRetention()
	mid := status0(t, a)
	if mid.GetLogStart() <= st.GetLogStart() || mid.GetLogStart() > 9 {
		t.Fatalf("after releasing the hold at 5: log start %d, want past %d and at most 9", mid.GetLogStart(), st.GetLogStart())
	}
	release(t, a, "high")
	a.srv.enforceRetention()
	last := status0(t, a)
	if last.GetLogStart() <= mid.GetLogStart() {
		t.Fatalf("after releasing every hold: log start %d, want past %d", last.GetLogStart(), mid.GetLogStart())
	}
	if n := len(last.GetForcedTrims()); n != 0 {
		t.Fatalf("%d forced trims without a hard limit", n)
	}
}

func TestHardRetentionLimitTrimsPastAHoldAndRecordsIt(t *testing.T) {
	dir := t.TempDir()
	a := startNodeAt(t, "a", dir, nil)
	configureWith(t, retentionConfig(2<<20), 1, a)
	appendLarge(t, a, 1, 16) // about 4.7 MiB
	hold(t, a, "slow", 0)
	hold(t, a, "fast", 15)

	before := time.Now().UnixMilli()
	a.srv.enforceRetention()
	st := status0(t, a)
	if st.GetLogStart() == 0 {
		t.Fatal("a hold kept the log past the hard limit")
	}
	trims := st.GetForcedTrims()
	if len(trims) != 1 {
		t.Fatalf("forced trims %v, want one, of slow", trims)
	}
	if tr := trims[0]; tr.GetConsumer() != "slow" || tr.GetHoldOffset() != 0 || tr.GetLogStart() != st.GetLogStart() || tr.GetTimeMs() < before {
		t.Fatalf("forced trim %v, want slow held from 0, trimmed to %d, at or after %d", tr, st.GetLogStart(), before)
	}
	// The hold stays: the consumer sees what it lost and moves on itself.
	if got, want := holdsOf(st), []string{"fast@15", "slow@0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("holds %v, want %v", got, want)
	}

	a = restart(t, a, dir)
	if got := status0(t, a).GetForcedTrims(); len(got) != 1 || got[0].GetConsumer() != "slow" || got[0].GetLogStart() != st.GetLogStart() {
		t.Fatalf("after restart: forced trims %v", got)
	}
	// Deleting the consumer forgets its trims too.
	release(t, a, "slow")
	if got := status0(t, a).GetForcedTrims(); len(got) != 0 {
		t.Fatalf("forced trims %v after the consumer was released", got)
	}
}

func TestCatchUpAdoptsTheSourceHolds(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, b := startNode(t, "a", nil), startNodeAt(t, "b", dir, nil)
	cfg := retentionConfig(0)
	configureWith(t, cfg, 1, a)
	appendLarge(t, a, 1, 12)
	hold(t, a, "agg", 1)

	chainReq := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(a), Config: cfg}
	if _, err := client(t, b.addr).CatchUp(ctx, &catenapb.CatchUpRequest{Chain: chainReq, SourceId: "a", SourceAddr: a.addr}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		st := status0(t, b)
		// Durable too: retention keeps what the copy does not hold durably.
		if got := holdsOf(st); !reflect.DeepEqual(got, []string{"agg@1"}) || st.GetLogEnd() != 12 || st.GetDurable() != 12 {
			return fmt.Errorf("b: holds %v, log end %d durable %d", got, st.GetLogEnd(), st.GetDurable())
		}
		return nil
	})
	// The copy's retention keeps what the chain keeps.
	b.srv.enforceRetention()
	if st := status0(t, b); st.GetLogStart() != 0 {
		t.Fatalf("the copy trimmed to %d past the hold at 1", st.GetLogStart())
	}
	// A change at the source reaches the copy while it follows.
	hold(t, a, "agg", 6)
	hold(t, a, "other", 7)
	eventually(t, 10*time.Second, func() error {
		if got := holdsOf(status0(t, b)); !reflect.DeepEqual(got, []string{"agg@6", "other@7"}) {
			return fmt.Errorf("b: holds %v", got)
		}
		return nil
	})
	b.srv.enforceRetention()
	if st := status0(t, b); st.GetLogStart() == 0 || st.GetLogStart() > 6 {
		t.Fatalf("the copy's log start is %d with the lowest hold at 6", st.GetLogStart())
	}
	// Adopted holds are the copy's own: durable across a restart.
	b = restart(t, b, dir)
	if got := holdsOf(status0(t, b)); !reflect.DeepEqual(got, []string{"agg@6", "other@7"}) {
		t.Fatalf("after restart: b holds %v", got)
	}
}

func TestHoldRetentionRefusesBadInputAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, "a", nil)
	configure(t, 1, a)
	ac := client(t, a.addr)
	hold(t, a, "ns/agg_1.x-y", 4)
	one := uint32(1)
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"empty consumer", func() error {
			_, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Offset: 1})
			return err
		}, codes.InvalidArgument},
		{"upper case", func() error {
			_, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Consumer: "Agg", Offset: 1})
			return err
		}, codes.InvalidArgument},
		{"leading dash", func() error {
			_, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Consumer: "-agg", Offset: 1})
			return err
		}, codes.InvalidArgument},
		{"trailing slash", func() error {
			_, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Consumer: "ns/", Offset: 1})
			return err
		}, codes.InvalidArgument},
		{"a space", func() error {
			_, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Consumer: "a b", Offset: 1})
			return err
		}, codes.InvalidArgument},
		{"254 characters", func() error {
			_, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Consumer: strings.Repeat("a", 254), Offset: 1})
			return err
		}, codes.InvalidArgument},
		{"unknown partition", func() error {
			_, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Partition: 1, Consumer: "agg", Offset: 1})
			return err
		}, codes.NotFound},
		{"unknown stream", func() error {
			_, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "t", Consumer: "agg", Offset: 1})
			return err
		}, codes.NotFound},
		{"release with a bad name", func() error {
			_, err := ac.ReleaseRetention(ctx, &catenapb.ReleaseRetentionRequest{Stream: "s", Consumer: "NS/AGG_1.X-Y"})
			return err
		}, codes.InvalidArgument},
		{"release of an unknown partition", func() error {
			_, err := ac.ReleaseRetention(ctx, &catenapb.ReleaseRetentionRequest{Stream: "s", Partition: &one, Consumer: "ns/agg_1.x-y"})
			return err
		}, codes.NotFound},
		{"a hard limit below the soft one", func() error {
			cfg := &catenapb.StreamConfig{Partitions: 1, RetentionBytes: 2 << 20, HardRetentionBytes: 1 << 20}
			_, err := ac.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Epoch: 1, Members: members(a), Config: cfg})
			return err
		}, codes.InvalidArgument},
	} {
		if err := tc.call(); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
	st := status0(t, a)
	if got := holdsOf(st); !reflect.DeepEqual(got, []string{"ns/agg_1.x-y@4"}) {
		t.Fatalf("holds %v after refused calls, want only ns/agg_1.x-y@4", got)
	}
	if st.GetConfig().GetHardRetentionBytes() != 0 {
		t.Fatalf("a refused configuration was installed: %v", st.GetConfig())
	}
	if _, err := ac.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Consumer: strings.Repeat("a", 253), Offset: 1}); err != nil {
		t.Fatalf("a 253-character name: %v", err)
	}
}

func TestDropTakesTheHoldsWithIt(t *testing.T) {
	ctx := context.Background()
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	hold(t, b, "agg", 3)
	// b is replaced (epoch 2 without it), then dropped.
	configure(t, 2, a)
	if _, err := client(t, b.addr).Drop(ctx, &catenapb.DropRequest{Stream: "s", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.srv.partitionDir("s", 0)); !os.IsNotExist(err) {
		t.Fatalf("partition directory after drop: %v", err)
	}
	// Back in a chain, the partition starts without holds.
	configure(t, 3, a, b)
	if got := holdsOf(status0(t, b)); len(got) != 0 {
		t.Fatalf("holds %v survived the drop", got)
	}
}

// A copy whose log ends below the source's log start (retention trimmed
// past it while it was away, or it starts empty on a trimmed partition)
// cannot continue from its end: it resets its log to start where the
// source's does, with the source's rolling checksum there, and copies
// from there, so that it ends equal to the source.
func TestCatchUpBelowTheSourcesLogStartResetsTheCopy(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, b := startNode(t, "a", nil), startNodeAt(t, "b", dir, nil)
	cfg := retentionConfig(0)
	configureWith(t, cfg, 1, a, b)
	appendLarge(t, a, 1, 2)
	converged(t, a, b)
	// b leaves; a goes on alone and trims past b's end.
	stopNode(b)
	configureWith(t, cfg, 2, a)
	appendLarge(t, a, 2, 12)
	a.srv.enforceRetention()
	src := status0(t, a)
	if src.GetLogStart() <= 2 {
		t.Fatalf("setup: a's log starts at %d, not past b's end 2", src.GetLogStart())
	}

	b = startNodeAt(t, "b", dir, nil)
	chainReq := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 2, Members: members(a), Config: cfg}
	if _, err := client(t, b.addr).CatchUp(ctx, &catenapb.CatchUpRequest{Chain: chainReq, SourceId: "a", SourceAddr: a.addr}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error {
		st := status0(t, b)
		if st.GetLogStart() != src.GetLogStart() || st.GetLogEnd() != src.GetLogEnd() || st.GetChecksum() != src.GetChecksum() {
			return fmt.Errorf("b holds [%d,%d) checksum %08x; a holds [%d,%d) checksum %08x",
				st.GetLogStart(), st.GetLogEnd(), st.GetChecksum(), src.GetLogStart(), src.GetLogEnd(), src.GetChecksum())
		}
		return nil
	})
	// The reset log is b's own: it survives a restart as it is.
	b = restart(t, b, dir)
	if st := status0(t, b); st.GetLogStart() != src.GetLogStart() || st.GetChecksum() != src.GetChecksum() || st.GetError() != "" {
		t.Fatalf("after restart: b holds [%d,%d) checksum %08x error %q", st.GetLogStart(), st.GetLogEnd(), st.GetChecksum(), st.GetError())
	}
}

// A stream's retention holds for partitions written without a segment
// size: segments are sized from the byte limits, and the active segment
// rolls once its first records are an eighth of the retention time old.
// Before, a partition kept up to a whole default segment (256 MiB) past
// retention.bytes, and, written slowly, its records past retention.time.
func TestRetentionBoundsAPartitionWithTheDefaultSegmentSize(t *testing.T) {
	ctx := context.Background()
	segBytes := func(t *testing.T, n *node) (total int64) {
		t.Helper()
		names, err := filepath.Glob(filepath.Join(n.srv.dataDir, "streams", "s", "00000", "*.seg"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			fi, err := os.Stat(name)
			if err != nil {
				t.Fatal(err)
			}
			total += fi.Size()
		}
		return total
	}
	t.Run("bytes", func(t *testing.T) {
		a := startNode(t, "a", nil)
		cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, RetentionBytes: 2 << 20}
		if _, err := a.rc.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(a), Config: cfg}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
		value := bytes.Repeat([]byte("x"), 64<<10)
		for i := range 128 { // 8 MiB
			if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1,
				Records: []*catenapb.AppendRecord{{Value: value, ProducerId: 1, Sequence: uint64(i + 1)}}}, grpc.WaitForReady(true)); err != nil {
				t.Fatal(err)
			}
		}
		a.srv.enforceRetention()
		// 2 MiB kept, and at most a segment of 1 MiB (an eighth of the
		// limit, at least 1 MiB) that holds the oldest of them.
		if got := segBytes(t, a); got > 3<<20+64<<10 {
			t.Fatalf("%d bytes of segments kept for a retention of %d", got, 2<<20)
		}
		if st := status0(t, a); st.GetLogStart() == 0 || st.GetLogEnd() != 128 {
			t.Fatalf("log [%d,%d) after retention, want it to start past 0 and end at 128", st.GetLogStart(), st.GetLogEnd())
		}
	})
	t.Run("time", func(t *testing.T) {
		a := startNode(t, "a", nil)
		cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, RetentionMs: time.Minute.Milliseconds()}
		if _, err := a.rc.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(a), Config: cfg}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-10 * time.Minute).UnixMilli()
		recs := records(1, 1, 10)
		for i, r := range recs {
			r.TimestampMs = old + int64(i)
		}
		if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: recs}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
		a.srv.enforceRetention()
		if st := status0(t, a); st.GetLogStart() != 10 || st.GetLogEnd() != 10 {
			t.Fatalf("log [%d,%d) after its records expired, want [10,10)", st.GetLogStart(), st.GetLogEnd())
		}
		// The partition goes on from there, also after a restart.
		stopNode(a)
		a = startNodeAt(t, "a", a.srv.dataDir, nil)
		if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 11, 2)}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
		if st := status0(t, a); st.GetLogStart() != 10 || st.GetLogEnd() != 12 {
			t.Fatalf("log [%d,%d) after a restart and an append, want [10,12)", st.GetLogStart(), st.GetLogEnd())
		}
	})
}
