package server

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// BenchmarkReplicaStart prices a replica's start-up over CATENA_START_PARTITIONS
// partitions (default 32) of CATENA_START_MIB MiB each (default 32) in
// their active segments, with the page cache of the data directory
// dropped first: each partition's last segment is read and checked
// whole, and its de-duplication table rebuilt. By how many partitions
// open at once (startConcurrency).
func BenchmarkReplicaStart(b *testing.B) {
	parts, mib := 32, 32
	if v, err := strconv.Atoi(os.Getenv("CATENA_START_PARTITIONS")); err == nil && v > 0 {
		parts = v
	}
	if v, err := strconv.Atoi(os.Getenv("CATENA_START_MIB")); err == nil && v > 0 {
		mib = v
	}
	dir := b.TempDir()
	opts := Options{ID: "a", DataDir: dir, Logger: logr.Discard(), Fatal: func(err error) { b.Error(err) }}
	srv, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	cfg := &catenapb.StreamConfig{Partitions: uint32(parts), Durability: catenapb.Durability_DURABILITY_INTERVAL, FsyncIntervalMs: 1000}
	value := make([]byte, 1000)
	for p := range uint32(parts) {
		if _, err := srv.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Partition: p, Epoch: 1, Members: []*catenapb.Member{{Id: "a", Addr: "127.0.0.1:1"}}, Config: cfg}); err != nil {
			b.Fatal(err)
		}
		for i := range mib {
			recs := make([]*catenapb.AppendRecord, 1000)
			for j := range recs {
				recs[j] = &catenapb.AppendRecord{Key: []byte(fmt.Sprintf("k%d", j)), Value: value, ProducerId: uint64(p) + 1, Sequence: uint64(i*1000 + j + 1)}
			}
			if _, err := srv.Append(ctx, &catenapb.AppendRequest{Stream: "s", Partition: p, Epoch: 1, Records: recs}); err != nil {
				b.Fatal(err)
			}
		}
	}
	srv.Close()
	dropCache := func() {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	defer func(n int) { startConcurrency = n }(startConcurrency)
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("at-once-%d", n), func(b *testing.B) {
			startConcurrency = n
			var took time.Duration
			for range b.N {
				dropCache()
				start := time.Now()
				srv, err := New(opts)
				if err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
				srv.Close()
			}
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/start")
			b.ReportMetric(float64(parts*mib)/took.Seconds()*float64(b.N), "MiB/s")
		})
	}
}
