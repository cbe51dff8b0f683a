package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// aggRef is the reference aggregate of one key, computed here from the
// whole source log, independently of the aggregator package: per
// partition in offset order, then partitions merged in partition order
// (the order the aggregator merges shards in, so float sums match to the
// bit).
type aggRef struct {
	n        int64
	sum      float64
	min, max float64
	users    map[string]bool
}

// TestAggregatorKillNineRestore runs a standalone aggregator against
// catena dev while producers write, kills it with SIGKILL at random points
// (each after a random number of folded records, so some land mid
// checkpoint: the snapshots of thousands of keys take several chunk
// records), starts a new one that restores from the checkpoint stream
// (two partitions for four shards: shards share them), and at the end
// compares every key's aggregates with the reference fold of the whole
// log: identical.
func TestAggregatorKillNineRestore(t *testing.T) {
	dir := t.TempDir()
	dev := startDev(t, filepath.Join(dir, "dev"), "--stream", "orders:4,orders-checkpoints:2")
	spec := filepath.Join(dir, "orders.yaml")
	err := os.WriteFile(spec, []byte(`apiVersion: streams.catena.io/v1alpha1
kind: Aggregation
metadata: {name: orders}
spec:
  source: orders
  key: {field: page}
  aggregates:
    - {name: n, function: Count}
    - {name: total, function: Sum, field: ms}
    - {name: low, function: Min, field: ms}
    - {name: high, function: Max, field: ms}
    - {name: users, function: DistinctCount, field: user}
  checkpointInterval: 1s
  snapshotEvery: 3
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	var worker *proc
	startWorker := func(i int) {
		worker = startProc(t, "catena aggregator", filepath.Join(dir, fmt.Sprintf("aggregator-%d.log", i)),
			"aggregator", "--spec", spec, "--checkpoint-stream", "orders-checkpoints", "--ingest", dev.state.Ingest, "--listen", addr, "--id", "w")
		t.Cleanup(func() { worker.stop(5 * time.Second) })
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	agg := catenapb.NewAggregatorClient(conn)
	status := func() (*catenapb.AggregatorStatus, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return agg.Status(ctx, &catenapb.AggregatorStatusRequest{})
	}
	folded := func() (uint64, error) {
		st, err := status()
		if err != nil {
			return 0, err
		}
		var n uint64
		for _, s := range st.Shards {
			n += s.Consumed
		}
		return n, nil
	}

	// Producers write until the kills are done.
	ctx, stopProducing := context.WithCancel(context.Background())
	defer stopProducing()
	var acked atomic.Int64
	var wg sync.WaitGroup
	for p := range 2 {
		futures := make(chan *client.Future, 4096)
		wg.Go(func() {
			for f := range futures {
				if _, err := f.Wait(); err == nil {
					acked.Add(1)
				}
			}
		})
		wg.Go(func() {
			defer close(futures)
			prod := client.NewProducer(dev.client, "orders", client.ProducerOptions{})
			defer prod.Close()
			r := rand.New(rand.NewPCG(uint64(p), 7))
			for i := 0; ctx.Err() == nil; i++ {
				v := fmt.Sprintf(`{"page": "p%04d", "ms": %.3f, "user": "u%d"}`, r.IntN(4000), r.Float64()*500, r.IntN(300))
				if i%97 == 0 {
					v = "not json" // skipped, and counted as skipped after every restore
				}
				futures <- prod.Send(ctx, client.Record{Key: []byte(fmt.Sprintf("k%d", r.IntN(1000))), Value: []byte(v)})
			}
		})
	}

	r := rand.New(rand.NewPCG(42, 43))
	restores := 0
	for i := range 6 {
		startWorker(i)
		base := uint64(0)
		eventually(t, 60*time.Second, func() error {
			n, err := folded()
			base = n
			return err
		})
		target := base + 2000 + uint64(r.IntN(20000))
		eventually(t, 120*time.Second, func() error {
			n, err := folded()
			if err != nil {
				return err
			}
			if n < target {
				return fmt.Errorf("folded %d of %d records before the kill", n, target)
			}
			return nil
		})
		st, err := status()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st.Shards {
			if rs := s.Restoration; rs != nil && rs.From != nil {
				restores++
			}
		}
		worker.kill9()
		t.Logf("kill %d: SIGKILL after %d records folded", i+1, target)
	}
	stopProducing()
	wg.Wait()
	if restores == 0 {
		t.Fatal("no worker ever restored from a checkpoint")
	}

	// The last worker restores and catches up with the whole log.
	startWorker(99)
	end := map[uint32]uint64{}
	for p := range uint32(4) {
		off, err := dev.client.ListOffsets(context.Background(), "orders", p, catenapb.OffsetSpec_OFFSET_SPEC_LATEST, 0)
		if err != nil {
			t.Fatal(err)
		}
		end[p] = off
	}
	eventually(t, 120*time.Second, func() error {
		st, err := status()
		if err != nil {
			return err
		}
		for _, s := range st.Shards {
			if s.Consumed < end[s.Shard] || s.Phase != catenapb.ShardPhase_SHARD_PHASE_RUNNING {
				return fmt.Errorf("shard %d at %d of %d (%s)", s.Shard, s.Consumed, end[s.Shard], s.Phase)
			}
		}
		return nil
	})

	// The reference: the whole log, read back.
	ref := map[string]*aggRef{}
	var records, skipped int
	for p := range uint32(4) {
		part := map[string]*aggRef{}
		for off := uint64(0); off < end[p]; {
			res, err := dev.client.Fetch(context.Background(), "orders", p, off, 4<<20, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range res.Messages {
				if m.Offset >= end[p] {
					break
				}
				records++
				var doc struct {
					Page string  `json:"page"`
					Ms   float64 `json:"ms"`
					User string  `json:"user"`
				}
				if jsonErr := jsonUnmarshal(m.Value, &doc); jsonErr != nil {
					skipped++
					continue
				}
				a := part[doc.Page]
				if a == nil {
					a = &aggRef{min: doc.Ms, max: doc.Ms, users: map[string]bool{}}
					part[doc.Page] = a
				}
				a.n++
				a.sum += doc.Ms
				a.min, a.max = math.Min(a.min, doc.Ms), math.Max(a.max, doc.Ms)
				a.users[doc.User] = true
			}
			off = res.NextOffset
		}
		for k, a := range part {
			if g := ref[k]; g == nil {
				ref[k] = a
			} else {
				g.n += a.n
				g.sum += a.sum
				g.min, g.max = math.Min(g.min, a.min), math.Max(g.max, a.max)
				for u := range a.users {
					g.users[u] = true
				}
			}
		}
	}
	if int64(records) < acked.Load() {
		t.Fatalf("the log holds %d records, fewer than the %d acknowledged", records, acked.Load())
	}

	qctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var keys []string
	for after := ""; ; {
		resp, err := agg.List(qctx, &catenapb.AggListRequest{After: after, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, resp.Keys...)
		if !resp.More {
			break
		}
		after = resp.Keys[len(resp.Keys)-1]
	}
	if len(keys) != len(ref) {
		t.Fatalf("the aggregator lists %d keys, the reference has %d", len(keys), len(ref))
	}
	for _, k := range keys {
		want := ref[k]
		if want == nil {
			t.Fatalf("key %q is not in the reference", k)
		}
		resp, err := agg.Get(qctx, &catenapb.AggGetRequest{Key: k})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Rows) != 1 {
			t.Fatalf("key %q: %d rows", k, len(resp.Rows))
		}
		v := resp.Rows[0].Values
		got := fmt.Sprintf("n=%d total=%x low=%x high=%x users=%d", v[0].GetIntValue(), math.Float64bits(v[1].GetFloatValue()),
			math.Float64bits(v[2].GetFloatValue()), math.Float64bits(v[3].GetFloatValue()), v[4].GetIntValue())
		exp := fmt.Sprintf("n=%d total=%x low=%x high=%x users=%d", want.n, math.Float64bits(want.sum),
			math.Float64bits(want.min), math.Float64bits(want.max), len(want.users))
		if got != exp {
			t.Fatalf("key %q: got %s, want %s", k, got, exp)
		}
	}
	st, err := status()
	if err != nil {
		t.Fatal(err)
	}
	var gotSkipped uint64
	for _, s := range st.Shards {
		gotSkipped += s.SkippedRecords
	}
	if gotSkipped != uint64(skipped) {
		t.Fatalf("skipped records: %d, want %d", gotSkipped, skipped)
	}
	t.Logf("%d records, %d keys identical to the reference after 6 SIGKILLs (%d shard restorations from checkpoints)", records, len(keys), restores)
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
