package server

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// TestTheCatchUpRateCapsAllCopiesOfAReplica: --catch-up-rate is what the
// replica copies in all, not what each copy may: a replica returning to
// hundreds of chains would otherwise copy at hundreds of times the rate
// meant to leave disk and CPU to the chains. Two partitions of 2 MiB each,
// copied at once under a cap of 2 MiB/s, take at least the time that 4 MiB
// take at that rate, less what is not waited for (a lower bound: a slower
// machine only takes longer; capped each, they would take half of it).
func TestTheCatchUpRateCapsAllCopiesOfAReplica(t *testing.T) {
	ctx := context.Background()
	const rate = 2 << 20
	streams := []string{"s", "t"}
	src := sourceOfCopies(t, streams...)
	c := &node{id: "c", fatal: make(chan error, 4)}
	startWith(t, c, t.TempDir(), Options{CatchUpBytesPerSecond: rate})
	cc := client(t, c.addr)

	start := time.Now()
	for _, stream := range streams {
		chain := &catenapb.ConfigureRequest{Stream: stream, Partition: 0, Epoch: 1, Members: members(src), Config: testConfig}
		if _, err := cc.CatchUp(ctx, &catenapb.CatchUpRequest{Chain: chain, SourceId: "b", SourceAddr: src.addr}); err != nil {
			t.Fatal(err)
		}
	}
	part := uint32(0)
	eventually(t, 30*time.Second, func() error {
		for _, stream := range streams {
			resp, err := cc.Status(ctx, &catenapb.StatusRequest{Stream: stream, Partition: &part})
			if err != nil {
				return err
			}
			if end := resp.GetPartitions()[0].GetLogEnd(); end < 2048 {
				return fmt.Errorf("%s: copied %d of 2048 records", stream, end)
			}
		}
		return nil
	})
	elapsed := time.Since(start)
	var total uint64
	for _, stream := range streams {
		p, err := src.srv.lookup(stream, 0)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := p.log.Usage()
		total += uint64(n)
	}
	// A copy waits after each chunk it appended: the limiter's burst and
	// each copy's last chunk are not waited for.
	least := time.Duration(float64(total-copyBurstBytes-copyChunkBytes*uint64(len(streams))) / rate * float64(time.Second))
	if elapsed < least {
		t.Errorf("copying %d KiB under a cap of %d KiB/s took %v, want at least %v: each copy was capped, not the replica", total>>10, rate>>10, elapsed.Round(time.Millisecond), least.Round(time.Millisecond))
	}
}

// TestACopyIsDurableOnceItHoldsTheSourcesCommittedLog: a copy fsyncs as
// soon as it holds what the source has committed, not only once a read
// comes back short: a log ending on a whole chunk stayed unsynced (and the
// copy not ready to join) until the next read's long poll ended.
func TestACopyIsDurableOnceItHoldsTheSourcesCommittedLog(t *testing.T) {
	ctx := context.Background()
	src := sourceOfCopies(t, "s") // 8 whole chunks
	c := startNode(t, "c", nil)
	c.srv.copyWait = time.Minute
	chain := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(src), Config: testConfig}
	if _, err := client(t, c.addr).CatchUp(ctx, &catenapb.CatchUpRequest{Chain: chain, SourceId: "b", SourceAddr: src.addr}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		if st := status0(t, c); st.GetDurable() != 2048 {
			return fmt.Errorf("copy: log end %d, durable %d; want both 2048", st.GetLogEnd(), st.GetDurable())
		}
		return nil
	})
}

// sourceOfCopies starts replica b, the sole member of a chain of each
// stream, holding 2,048 records of 1,000 bytes in each: 32 frames of 64
// records, 8 whole chunks of a copy.
func sourceOfCopies(t *testing.T, streams ...string) *node {
	t.Helper()
	ctx := context.Background()
	src := startNode(t, "b", nil)
	bc := client(t, src.addr)
	value := bytes.Repeat([]byte("v"), 1000)
	for _, stream := range streams {
		req := &catenapb.ConfigureRequest{Stream: stream, Partition: 0, Epoch: 1, Members: members(src), Config: testConfig}
		if _, err := bc.Configure(ctx, req); err != nil {
			t.Fatal(err)
		}
		for range 32 {
			recs := make([]*catenapb.AppendRecord, 64)
			for i := range recs {
				recs[i] = &catenapb.AppendRecord{Value: value}
			}
			if _, err := bc.Append(ctx, &catenapb.AppendRequest{Stream: stream, Epoch: 1, Records: recs}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return src
}
