package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/yaml"

	"github.com/catena-streams/catena/aggregator"
	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// BenchmarkAggregatorRestore measures a real `catena aggregator`
// restoring a shard of 1M keys: a snapshot plus two increments in the
// checkpoint stream of a catena dev, then a replay of the source records
// after them. It prints the time to state-ready (checkpoints read and
// loaded) and the replay rate. Run it with make bench-restore
// (CATENA_RESTORE_KEYS, CATENA_RESTORE_REPLAY change the sizes).
func BenchmarkAggregatorRestore(b *testing.B) {
	keys := envInt("CATENA_RESTORE_KEYS", 1_000_000)
	replay := envInt("CATENA_RESTORE_REPLAY", 200_000)
	updates := keys / 10
	dir := b.TempDir()
	dev := startDev(b, filepath.Join(dir, "dev"), "--stream", "views:1,views-checkpoints:1", "--durability", "interval")
	ctx := context.Background()

	spec := streamsv1alpha1.AggregationSpec{
		Source: "views",
		Aggregates: []streamsv1alpha1.AggregateSpec{
			{Name: "n", Function: streamsv1alpha1.AggregateCount},
			{Name: "total", Function: streamsv1alpha1.AggregateSum, Field: "ms"},
			{Name: "high", Function: streamsv1alpha1.AggregateMax, Field: "ms"},
		},
		SnapshotEvery: 100,
	}
	spec.CheckpointInterval.Duration = time.Hour // the restored worker writes none during the run
	plan, err := aggregator.Compile(spec)
	if err != nil {
		b.Fatal(err)
	}

	// The source: keys unique records, then updates of every tenth key
	// (two increments' worth), then replay more to be read after restore.
	total := keys + 2*updates + replay
	prod := client.NewProducer(dev.client, "views", client.ProducerOptions{MaxInFlight: 16})
	start := time.Now()
	futures := make(chan *client.Future, 8192)
	failed := make(chan error, 1)
	go func() {
		var first error
		for f := range futures {
			if _, err := f.Wait(); err != nil && first == nil {
				first = err
			}
		}
		failed <- first
	}()
	for i := 0; i < total; i++ {
		k := i
		if i >= keys {
			k = (i * 7919) % keys
		}
		futures <- prod.Send(ctx, client.Record{Key: fmt.Appendf(nil, "user-%07d", k), Value: fmt.Appendf(nil, `{"ms": %d}`, i%1000)})
	}
	close(futures)
	if err := <-failed; err != nil {
		b.Fatalf("a source record was not stored: %v", err)
	}
	if err := prod.Close(); err != nil {
		b.Fatal(err)
	}
	b.Logf("source: %d records produced in %s", total, time.Since(start).Round(time.Millisecond))

	// The previous worker: fold and checkpoint as the aggregator does.
	agg := streamsv1alpha1.Aggregation{}
	agg.Name, agg.Namespace, agg.Spec = "views", "local", spec
	log := aggregator.NewStreamLog(dev.client, "views-checkpoints")
	defer log.Close()
	cp := &aggregator.Checkpointer{Plan: plan, Log: log, Shard: 0, Partition: 0, Writer: 1}
	st := aggregator.NewState(plan, keys)
	var bytes int
	off := uint64(0)
	for _, upto := range []int{keys, keys + updates, keys + 2*updates} {
		for off < uint64(upto) {
			res, err := dev.client.Fetch(ctx, "views", 0, off, 16<<20, 0)
			if err != nil {
				b.Fatal(err)
			}
			for _, m := range res.Messages {
				if m.Offset >= uint64(upto) {
					break
				}
				st.Fold(m.Key, m.Value, m.TimestampMs)
				off = m.Offset + 1
			}
		}
		w, err := cp.Write(ctx, cp.Capture(st, off, 0, time.Now()))
		if err != nil {
			b.Fatal(err)
		}
		bytes += w.Bytes
		b.Logf("checkpoint at source offset %d: snapshot=%v, %d bytes", off, w.Manifest.Snapshot, w.Bytes)
	}

	manifest, err := yaml.Marshal(agg)
	if err != nil {
		b.Fatal(err)
	}
	specFile := filepath.Join(dir, "views.yaml")
	if err := os.WriteFile(specFile, append([]byte("apiVersion: streams.catena.io/v1alpha1\nkind: Aggregation\n"), manifest...), 0o644); err != nil {
		b.Fatal(err)
	}
	addr := freeAddr(b)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ac := catenapb.NewAggregatorClient(conn)

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := startProc(b, "catena aggregator", filepath.Join(dir, fmt.Sprintf("aggregator-%d.log", i)),
			"aggregator", "--spec", specFile, "--checkpoint-stream", "views-checkpoints", "--ingest", dev.state.Ingest, "--listen", addr, "--id", "bench")
		var rest *catenapb.Restoration
		eventually(b, 5*time.Minute, func() error {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			s, err := ac.Status(cctx, &catenapb.AggregatorStatusRequest{})
			if err != nil {
				return err
			}
			if len(s.Shards) != 1 || s.Shards[0].Phase != catenapb.ShardPhase_SHARD_PHASE_RUNNING {
				return fmt.Errorf("not running yet: %v", s.Shards)
			}
			rest = s.Shards[0].Restoration
			return nil
		})
		w.stop(5 * time.Second)
		if rest.Keys != uint64(st.Len()) || rest.CheckpointsLoaded != 3 || rest.RecordsReplayed != uint64(replay) {
			b.Fatalf("restored %d keys from %d checkpoints and replayed %d; want %d, 3 and %d", rest.Keys, rest.CheckpointsLoaded, rest.RecordsReplayed, st.Len(), replay)
		}
		replaySecs := float64(rest.ReplayMs-rest.LoadMs) / 1000
		b.ReportMetric(float64(rest.LoadMs), "ms-to-state-ready")
		b.ReportMetric(float64(replay)/replaySecs, "replay-rec/s")
		restored := grepLines(filepath.Join(dir, fmt.Sprintf("aggregator-%d.log", i)), "Shard re")
		b.Logf("worker log: %s", restored)
		minor, major := logField(restored, "minorFaults"), logField(restored, "majorFaults")
		b.ReportMetric(float64(minor), "page-faults")
		fmt.Printf("restore: %d keys from a snapshot and 2 increments (%.1f MiB) ready in %d ms with %d page faults (%d major); then replayed %d records in %d ms (%.0f records/s)\n",
			keys, float64(bytes)/(1<<20), rest.LoadMs, minor, major, replay, rest.ReplayMs-rest.LoadMs, float64(replay)/replaySecs)
	}
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		var n int
		if _, err := fmt.Sscan(v, &n); err == nil && n > 0 {
			return n
		}
	}
	return def
}

// logField returns the integer value of name=N in a log line (0 if absent).
func logField(line, name string) int64 {
	var n int64
	if i := strings.Index(line, name+"="); i >= 0 {
		fmt.Sscan(line[i+len(name)+1:], &n)
	}
	return n
}

// grepLines returns the lines of a file that contain s.
func grepLines(path, s string) string {
	b, _ := os.ReadFile(path)
	return linesWith(string(b), s)
}
