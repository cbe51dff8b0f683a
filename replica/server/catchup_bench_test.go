package server

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// BenchmarkCatchUp measures a replacement's copy outside the chain: a chain
// [a b] holds CATENA_CATCHUP_MIB MiB (default 512) of 1 KiB records, a
// producer appends 10-record batches every 2 ms (5,000 records/s), and an
// empty replica c copies the log from the tail b. It reports the copy rate
// and the producer's append latency before and during the copy (the target:
// 150 MiB/s or more with p99 at most twice normal). Run it with
// `make bench-catchup` (CATENA_CATCHUP_RATE caps the copy in MiB/s, as
// `catena replica --catch-up-rate` does, 0 for no cap; its default
// otherwise); every member fsyncs before acknowledging, on the machine's
// disk under the test's temporary directory. CATENA_CATCHUP_CPUPROFILE
// names a file for a CPU profile of the copy alone (the fill before it
// left out).
func BenchmarkCatchUp(b *testing.B) {
	mib := 512
	if v, err := strconv.Atoi(os.Getenv("CATENA_CATCHUP_MIB")); err == nil && v > 0 {
		mib = v
	}
	for range b.N {
		runCatchUpBench(b, mib)
	}
}

func runCatchUpBench(b *testing.B, mib int) {
	ctx := context.Background()
	// The copy rate as catena replica --catch-up-rate sets it, on every
	// replica (the source paces what it serves at it too): its default
	// unless CATENA_CATCHUP_RATE says (0: no cap).
	mibps := DefaultCatchUpMiBPerSecond
	if v, err := strconv.Atoi(os.Getenv("CATENA_CATCHUP_RATE")); err == nil && v >= 0 {
		mibps = v
	}
	opts := Options{CatchUpBytesPerSecond: int64(mibps) << 20}
	a, bb := &node{id: "a", fatal: make(chan error, 4)}, &node{id: "b", fatal: make(chan error, 4)}
	startWith(b, a, b.TempDir(), opts)
	startWith(b, bb, b.TempDir(), opts)
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: []*catenapb.Member{{Id: "a", Addr: a.addr}, {Id: "b", Addr: bb.addr}}, Config: testConfig}
	for _, n := range []*node{bb, a} {
		if _, err := client(b, n.addr).Configure(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	ac := client(b, a.addr)
	value := make([]byte, 1000)
	batch := func(n int) []*catenapb.AppendRecord {
		recs := make([]*catenapb.AppendRecord, n)
		for i := range recs {
			recs[i] = &catenapb.AppendRecord{Key: []byte("k"), Value: value}
		}
		return recs
	}
	// Fill: 1 MiB appends, several in flight.
	fill := batch(1000)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for range mib {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: fill}); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		return
	}

	// The producer: 10 records every 2 ms, each append's latency recorded
	// with the phase it started in.
	var (
		mu      sync.Mutex
		phase   = 0
		lat     = [2][]time.Duration{}
		stop    = make(chan struct{})
		stopped = make(chan struct{})
	)
	go func() {
		defer close(stopped)
		small := batch(10)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			mu.Lock()
			ph := phase
			mu.Unlock()
			start := time.Now()
			if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: small}); err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			lat[ph] = append(lat[ph], time.Since(start))
			mu.Unlock()
		}
	}()
	<-time.After(3 * time.Second) // the normal phase

	// The joiner runs on a machine of its own in a cluster; here it shares
	// the disk with the chain unless CATENA_CATCHUP_JOINER_DIR puts its
	// log elsewhere (another disk, or /dev/shm to leave only the source's
	// side of the copy on this one).
	dir := b.TempDir()
	if d := os.Getenv("CATENA_CATCHUP_JOINER_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "catena-catchup-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	c := &node{id: "c", fatal: make(chan error, 4)}
	startWith(b, c, dir, opts)
	cc := client(b, c.addr)
	mu.Lock()
	phase = 1
	mu.Unlock()
	if path := os.Getenv("CATENA_CATCHUP_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	start := time.Now()
	if _, err := cc.CatchUp(ctx, &catenapb.CatchUpRequest{Chain: req, SourceId: "b", SourceAddr: bb.addr}); err != nil {
		b.Fatal(err)
	}
	var copied uint64
	for {
		st := status0(b, c)
		head := status0(b, a)
		if st.GetDurable() >= head.GetCommitted() && st.GetDurable() > 0 {
			copied = st.GetDurable()
			break
		}
		<-time.After(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	close(stop)
	<-stopped

	bytes := float64(copied) * 1024 // records of ~1 KiB as stored
	rate := bytes / (1 << 20) / elapsed.Seconds()
	p := func(ds []time.Duration, q float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}
	normal99, during99 := p(lat[0], 0.99), p(lat[1], 0.99)
	b.ReportMetric(rate, "MiB/s")
	b.ReportMetric(float64(normal99.Microseconds())/1000, "p99-normal-ms")
	b.ReportMetric(float64(during99.Microseconds())/1000, "p99-during-ms")
	where := "joiner's log on the chain's disk"
	if d := os.Getenv("CATENA_CATCHUP_JOINER_DIR"); d != "" {
		where = "joiner's log under " + d
	}
	fmt.Printf("catch-up (%s, cap %d MiB/s): %d records (~%.0f MiB) in %.2fs = %.0f MiB/s; producer append p50/p99 before %v/%v (n=%d), during %v/%v (n=%d)\n",
		where, mibps, copied, bytes/(1<<20), elapsed.Seconds(), rate, p(lat[0], 0.5).Round(time.Microsecond*100), normal99.Round(time.Microsecond*100), len(lat[0]),
		p(lat[1], 0.5).Round(time.Microsecond*100), during99.Round(time.Microsecond*100), len(lat[1]))
}
