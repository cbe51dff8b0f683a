package server

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/partlog"
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
	// Longer than the wait below: a copy that fsyncs only once a read
	// comes back short waits out a long poll first (the source holds one
	// at most maxReadWait).
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

// TestTheCatchUpRateCapsTheCopiesAReplicaServes: replicas returning at
// once (a power cut, several nodes back together) all copy from the
// survivors, each at its own cap; a source serving them all at every
// copier's cap would read and send at a multiple of the rate meant to
// leave its disk and CPU to its chains. Two uncapped replicas copy the
// same 2 MiB partition from a source capped at 2 MiB/s: at least the time
// 4 MiB take at that rate, less what is not waited for (a lower bound: a
// slower machine only takes longer; uncapped at the source, each copy took
// a few milliseconds).
func TestTheCatchUpRateCapsTheCopiesAReplicaServes(t *testing.T) {
	ctx := context.Background()
	const rate = 2 << 20
	src := sourceOfCopiesWith(t, Options{CatchUpBytesPerSecond: rate}, "s")
	var copiers []*node
	start := time.Now()
	for _, id := range []string{"c", "d"} {
		n := startNode(t, id, nil)
		copiers = append(copiers, n)
		chain := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(src), Config: testConfig}
		if _, err := client(t, n.addr).CatchUp(ctx, &catenapb.CatchUpRequest{Chain: chain, SourceId: "b", SourceAddr: src.addr}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, func() error {
		for _, n := range copiers {
			if end := status0(t, n).GetLogEnd(); end < 2048 {
				return fmt.Errorf("%s copied %d of 2048 records", n.id, end)
			}
		}
		return nil
	})
	elapsed := time.Since(start)
	p, err := src.srv.lookup("s", 0)
	if err != nil {
		t.Fatal(err)
	}
	size, _ := p.log.Usage()
	// Not waited for: the source limiter's burst, and each copy's first
	// read (it learns where history ends).
	least := time.Duration(float64(2*uint64(size)-copyBurstBytes-2*copyChunkBytes) / rate * float64(time.Second))
	if elapsed < least {
		t.Errorf("serving two copies of %d KiB under a cap of %d KiB/s took %v, want at least %v: the source did not cap what it served", size>>10, rate>>10, elapsed.Round(time.Millisecond), least.Round(time.Millisecond))
	}
}

// TestABusySourceRefusesHistoryItCannotServeInTime: a source whose cap is
// spoken for past a history read's deadline refuses the read at once,
// before reading anything (RESOURCE_EXHAUSTED; the copier backs off), and
// serves what is not history unpaced. Waiting past the deadline instead
// failed the read after the source had read it, and the copier asked again
// 100 ms later: with more copies than the cap serves, the source read
// about 40 times what it sent (found in review).
func TestABusySourceRefusesHistoryItCannotServeInTime(t *testing.T) {
	const rate = 64 << 10 // a 256 KiB read past the burst waits 4 s
	src := sourceOfCopiesWith(t, Options{CatchUpBytesPerSecond: rate}, "s")
	rc := client(t, src.addr)
	read := func(from uint64, history bool) (*catenapb.ReadFramesResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return rc.ReadFrames(ctx, &catenapb.ReadFramesRequest{Stream: "s", From: from, MaxBytes: copyChunkBytes, History: history})
	}
	// The burst: four chunks at once.
	var from uint64
	for i := range copyBurstBytes / copyChunkBytes {
		resp, err := read(from, true)
		if err != nil {
			t.Fatalf("history read %d, within the burst: %v", i, err)
		}
		from = frameEnd(t, resp)
	}
	before := counterValue(src.srv.metrics.serveRefused)
	_, err := read(from, true)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "retry later") {
		t.Fatalf("a history read past the burst, 2 s to its deadline: %v; want RESOURCE_EXHAUSTED saying to retry later", err)
	}
	if got := counterValue(src.srv.metrics.serveRefused) - before; got != 1 {
		t.Errorf("catena_replica_copy_serve_refused_total rose by %v, want 1", got)
	}
	// What is not history is not paced.
	if _, err := read(from, false); err != nil {
		t.Fatalf("a read of what is not history while the cap is spoken for: %v", err)
	}
}

// counterValue reads c.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// frameEnd is the offset after the last frame of resp.
func frameEnd(t *testing.T, resp *catenapb.ReadFramesResponse) uint64 {
	t.Helper()
	frames := resp.GetFrames()
	if len(frames) == 0 {
		t.Fatal("no frames in the answer")
	}
	h, err := partlog.DecodeHeader(frames[len(frames)-1])
	if err != nil {
		t.Fatal(err)
	}
	return h.End()
}

// sourceOfCopies starts replica b, the sole member of a chain of each
// stream, holding 2,048 records of 1,000 bytes in each: 32 frames of 64
// records, 8 whole chunks of a copy.
func sourceOfCopies(t *testing.T, streams ...string) *node {
	t.Helper()
	return sourceOfCopiesWith(t, Options{}, streams...)
}

// sourceOfCopiesWith is sourceOfCopies with b started with opts.
func sourceOfCopiesWith(t *testing.T, opts Options, streams ...string) *node {
	t.Helper()
	ctx := context.Background()
	src := &node{id: "b", fatal: make(chan error, 4)}
	startWith(t, src, t.TempDir(), opts)
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

// TestACopyClosesInOnAChainWrittenFasterThanTheCap: the cap paces the
// history a copy found when it began, not what its chain writes meanwhile.
// A chain written at about twice the cap would otherwise leave its copy
// further behind every second, and the copy would never join (nor would
// any of many copies sharing the cap, each written faster than its share).
// The cap paces history at both ends: at the copying replica and at the
// source it copies from.
func TestACopyClosesInOnAChainWrittenFasterThanTheCap(t *testing.T) {
	const rate = 512 << 10
	capped := Options{CatchUpBytesPerSecond: rate}
	t.Run("capped copier", func(t *testing.T) { copyClosesIn(t, Options{}, capped) })
	t.Run("capped source", func(t *testing.T) { copyClosesIn(t, capped, Options{}) })
}

func copyClosesIn(t *testing.T, source, copier Options) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := sourceOfCopiesWith(t, source, "s") // 2 MiB of history
	c := &node{id: "c", fatal: make(chan error, 4)}
	startWith(t, c, t.TempDir(), copier)

	// The chain goes on at about 1 MiB/s: 64 KiB every 60 ms.
	bc := client(t, src.addr)
	value := bytes.Repeat([]byte("w"), 1000)
	writing := make(chan error, 1)
	go func() {
		tick := time.NewTicker(60 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				writing <- nil
				return
			case <-tick.C:
			}
			recs := make([]*catenapb.AppendRecord, 64)
			for i := range recs {
				recs[i] = &catenapb.AppendRecord{Value: value}
			}
			if _, err := bc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: recs}); err != nil && ctx.Err() == nil {
				writing <- err
				return
			}
		}
	}()

	chain := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(src), Config: testConfig}
	if _, err := client(t, c.addr).CatchUp(ctx, &catenapb.CatchUpRequest{Chain: chain, SourceId: "b", SourceAddr: src.addr}); err != nil {
		t.Fatal(err)
	}
	// Within a few of the chain's appends of its log end, while it is
	// still being written.
	eventually(t, 30*time.Second, func() error {
		copied, committed := status0(t, c).GetLogEnd(), status0(t, src).GetCommitted()
		if copied+256 < committed {
			return fmt.Errorf("the copy holds %d of the chain's %d records", copied, committed)
		}
		return nil
	})
	cancel()
	if err := <-writing; err != nil {
		t.Fatalf("the chain's writer: %v", err)
	}
}
