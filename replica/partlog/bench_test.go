package partlog_test

import (
	"bytes"
	"testing"

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
