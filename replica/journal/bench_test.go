package journal

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// machineBusy reads the busy and total ticks of all CPUs from /proc/stat
// (kernel threads and interrupts included: the writeback of an fsync runs
// partly outside the process).
func machineBusy() (busy, total uint64) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0
	}
	fields := strings.Fields(sc.Text())[1:]
	for i, s := range fields {
		v, _ := strconv.ParseUint(s, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// BenchmarkAppendsOf256Partitions is the storage half of the 256-partition
// keyed row of make bench (docs/benchmarks.md): 256 partitions, each
// appending frames of 48 KiB one at a time (one append in flight per
// partition, as ingestion sends them) and waiting until it is durable.
// "fsync each" is today's path (a write and an fsync of the partition's
// segment file); "journal" writes the partition's file without an fsync
// and the frame to the journal, whose group commit makes it durable. The
// segment files' lazy flush of docs/journal.md is left to the kernel's
// writeback here; "no fsync" (not durable) is what the writes alone cost.
// Prints appends/s, fsyncs per append and the machine's CPU
// per append (all processes and kernel threads).
func BenchmarkAppendsOf256Partitions(b *testing.B) {
	const (
		partitions = 256
		frameBytes = 48 << 10
	)
	payload := make([]byte, frameBytes)
	for i := range payload {
		payload[i] = byte(i)
	}
	const (
		fsyncEach = iota
		journal
		noSync // not durable: what the write alone costs
	)
	run := func(b *testing.B, mode int) {
		useJournal := mode == journal
		dir := b.TempDir()
		files := make([]*os.File, partitions)
		for i := range files {
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("p%03d.log", i)))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			files[i] = f
		}
		var j *Journal
		if useJournal {
			var err error
			if j, err = New(Options{Dir: filepath.Join(dir, "journal")}, 0); err != nil {
				b.Fatal(err)
			}
			defer j.Close()
		}
		var (
			left   atomic.Int64
			fsyncs atomic.Int64
			wg     sync.WaitGroup
			failed atomic.Pointer[error]
		)
		left.Store(int64(b.N))
		busy0, total0 := machineBusy()
		start := time.Now()
		b.ResetTimer()
		for p := range partitions {
			wg.Go(func() {
				var off int64
				for i := uint64(0); left.Add(-1) >= 0; i++ {
					err := func() error {
						if _, err := files[p].WriteAt(payload, off); err != nil {
							return err
						}
						off += frameBytes
						switch mode {
						case noSync:
							return nil
						case fsyncEach:
							fsyncs.Add(1)
							return files[p].Sync()
						}
						t, err := j.Append(&Logged{Record: Record{Kind: Frame, Part: PartitionID{Stream: "s", Partition: uint32(p)}, Incarnation: 1, Epoch: 1, Base: i, End: i + 1}, Payload: payload})
						if err != nil {
							return err
						}
						return j.Wait(t)
					}()
					if err != nil {
						failed.Store(&err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		elapsed := time.Since(start)
		busy1, total1 := machineBusy()
		if err := failed.Load(); err != nil {
			b.Fatal(*err)
		}
		if j != nil {
			st := j.Stats()
			fsyncs.Store(int64(st.Groups))
			b.ReportMetric(float64(st.Records)/float64(max(st.Groups, 1)), "appends/group")
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "appends/s")
		b.ReportMetric(float64(fsyncs.Load())/float64(b.N), "fsyncs/append")
		if total1 > total0 {
			// Ticks are 10 ms of one CPU; busy/total of the whole machine
			// over the run, times the CPUs' time, per append.
			cpu := float64(busy1-busy0) / float64(total1-total0) * elapsed.Seconds() * float64(runtime.NumCPU())
			b.ReportMetric(cpu/float64(b.N)*1e6, "machine-CPU-µs/append")
		}
	}
	b.Run("fsync each", func(b *testing.B) { run(b, fsyncEach) })
	b.Run("journal", func(b *testing.B) { run(b, journal) })
	b.Run("no fsync", func(b *testing.B) { run(b, noSync) })
}
