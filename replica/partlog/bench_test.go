package partlog_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/catena-streams/catena/replica/partlog"
)

// BenchmarkAppendSync is the hot path of the 100k records/s benchmark: one
// 64-record batch of 1 KiB values appended and fsynced per operation, on the
// real file system. MB/s counts record values.
func BenchmarkAppendSync(b *testing.B) {
	const recsPerBatch, valueSize = 64, 1024
	l, err := partlog.Open(partlog.Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	recs := make([]partlog.Record, recsPerBatch)
	value := bytes.Repeat([]byte{'v'}, valueSize)
	for i := range recs {
		recs[i] = partlog.Record{TimestampMs: 1_700_000_000_000, ProducerID: 1, Key: []byte("key-0000"), Value: value}
	}
	var frame []byte
	b.SetBytes(recsPerBatch * valueSize)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range recs {
			recs[j].Sequence = uint64(i*recsPerBatch + j)
		}
		frame, err = partlog.AppendBatch(frame[:0], 1, l.NextOffset(), recs)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Append(frame); err != nil {
			b.Fatal(err)
		}
		if err := l.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*recsPerBatch)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkReadRecent reads the newest ~1 MiB of frames, as a consumer
// tailing the log does.
func BenchmarkReadRecent(b *testing.B) {
	l, err := partlog.Open(partlog.Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	for range 200 {
		appendAll(b, l, []batch{{epoch: 1, n: 64, vsize: 1024}})
	}
	from := l.NextOffset() - 16*64
	b.SetBytes(16 * 64 * 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		frames, err := l.ReadFrames(from, l.NextOffset(), 1<<20+1<<16)
		if err != nil || len(frames) != 16 {
			b.Fatal(len(frames), err)
		}
	}
}

// BenchmarkOpen opens a log of CATENA_OPEN_MIB MiB (512 by default) of
// 1 KiB records in 128 MiB segments, its files' pages dropped from the
// cache first, as a replica's restart finds them: with the sealed
// segments' summaries (Open reads the last segment only) and without
// (Open reads and checks every frame, as it did before them).
func BenchmarkOpen(b *testing.B) {
	mib := 512
	if v, err := strconv.Atoi(os.Getenv("CATENA_OPEN_MIB")); err == nil && v > 0 {
		mib = v
	}
	dir := b.TempDir()
	l, err := partlog.Open(partlog.Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]partlog.Record, 1000)
	for i := range recs {
		recs[i] = partlog.Record{TimestampMs: 1_700_000_000_000, ProducerID: 1, Key: []byte("key"), Value: bytes.Repeat([]byte{'v'}, 1000)}
	}
	var frame []byte
	for {
		if used, _ := l.Usage(); used >= int64(mib)<<20 {
			break
		}
		if frame, err = partlog.AppendBatch(frame[:0], 1, l.NextOffset(), recs); err != nil {
			b.Fatal(err)
		}
		if err := l.Append(frame); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	dropCache := func() {
		names, err := os.ReadDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range names {
			f, err := os.Open(filepath.Join(dir, n.Name()))
			if err != nil {
				b.Fatal(err)
			}
			_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
			f.Close()
		}
	}
	for _, summaries := range []bool{true, false} {
		name := "scan"
		if summaries {
			name = "summaries"
		}
		b.Run(name, func(b *testing.B) {
			var took time.Duration
			for range b.N {
				if !summaries {
					sums, _ := filepath.Glob(filepath.Join(dir, "*.sum"))
					for _, s := range sums {
						_ = os.Remove(s)
					}
				}
				dropCache()
				start := time.Now()
				l, err := partlog.Open(partlog.Options{Dir: dir})
				if err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
				if err := l.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/open")
			b.ReportMetric(float64(mib), "MiB")
		})
	}
}
