package main

import (
	"fmt"
	mrand "math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/catena-streams/catena/client"
)

type benchFlags struct {
	stream       string
	recordSize   int
	records      int
	producers    int
	rate         float64
	batchBytes   int
	linger       time.Duration
	maxInFlight  int
	keys         int
	progress     bool
	retryTimeout time.Duration
	sync         bool
}

type benchResult struct {
	Records       uint64  `json:"records"`
	Errors        uint64  `json:"errors"`
	Seconds       float64 `json:"seconds"`
	RecordsPerSec float64 `json:"records_per_sec"`
	MiBPerSec     float64 `json:"mib_per_sec"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	P999Ms        float64 `json:"p999_ms"`
	MaxMs         float64 `json:"max_ms"`
	MeanMs        float64 `json:"mean_ms"`
	Producers     int     `json:"producers"`
	RecordSize    int     `json:"record_size"`
	TargetRate    float64 `json:"target_rate"`
	Sync          bool    `json:"sync,omitempty"`
}

func newBenchCommand(a *app) *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench --stream S [--record-size 1024] [--records N] [--producers P] [--rate R]",
		Short: "Measure produce throughput and acknowledgement latency",
		Long: "Produce N records of --record-size bytes (keys spread over --keys keys) and\n" +
			"measure each record's latency from send to acknowledgement. With --rate the\n" +
			"sends are paced open-loop and latency counts from the intended send time\n" +
			"(no coordinated omission). Prints progress to stderr every second (when it\n" +
			"is a terminal, or with --progress) and a final JSON line on stdout.",
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.bench(cmd, &f)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.stream, "stream", "", "stream to produce to (required)")
	fl.IntVar(&f.recordSize, "record-size", 1024, "value bytes per record")
	fl.IntVar(&f.records, "records", 100000, "records to produce in total")
	fl.IntVar(&f.producers, "producers", 1, "concurrent producers")
	fl.Float64Var(&f.rate, "rate", 0, "target records/s over all producers (0 = full speed)")
	fl.IntVar(&f.batchBytes, "batch-bytes", 512<<10, "max bytes per produce request")
	fl.DurationVar(&f.linger, "linger", time.Millisecond, "batching delay")
	fl.IntVar(&f.maxInFlight, "max-in-flight", 6, "produce requests in flight per producer")
	fl.IntVar(&f.keys, "keys", 1024, "distinct keys (0 = no key)")
	fl.BoolVar(&f.progress, "progress", false, "print progress to stderr even when it is not a terminal")
	fl.DurationVar(&f.retryTimeout, "retry-timeout", 30*time.Second, "give up on a record after retrying this long")
	fl.BoolVar(&f.sync, "sync", false, "each producer sends a record only once the previous one is acknowledged: the latency of one write on its own, no batching, no pacing timer")
	return cmd
}

type benchPending struct {
	f        *client.Future
	intended time.Time
}

type benchWorker struct {
	hist     histogram
	errors   uint64
	firstErr error
	lastAck  time.Time
}

func (a *app) bench(cmd *cobra.Command, f *benchFlags) error {
	if err := requireStream(f.stream); err != nil {
		return err
	}
	switch {
	case f.recordSize < 1:
		return usageErrorf("--record-size must be at least 1")
	case f.records < 1:
		return usageErrorf("--records must be at least 1")
	case f.producers < 1:
		return usageErrorf("--producers must be at least 1")
	case f.rate < 0:
		return usageErrorf("--rate must be >= 0")
	case f.keys < 0:
		return usageErrorf("--keys must be >= 0")
	case f.batchBytes < 1:
		return usageErrorf("--batch-bytes must be at least 1")
	case f.maxInFlight < 1:
		return usageErrorf("--max-in-flight must be at least 1")
	case f.sync && f.rate > 0:
		return usageErrorf("--sync and --rate are exclusive: a synchronous producer sends as soon as its last record is acknowledged")
	}
	ctx := cmd.Context()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()

	value := make([]byte, f.recordSize)
	for i := range value {
		value[i] = byte('a' + mrand.IntN(26))
	}
	keys := make([][]byte, f.keys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%06d", i)
	}
	linger := f.linger
	if linger <= 0 || f.sync {
		linger = -1 // a synchronous producer has nothing to wait for
	}
	opts := client.ProducerOptions{Linger: linger, MaxBatchBytes: f.batchBytes, MaxInFlight: f.maxInFlight, RetryTimeout: f.retryTimeout}

	var acked, failed atomic.Uint64
	workers := make([]*benchWorker, f.producers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range f.producers {
		n := f.records / f.producers
		if i < f.records%f.producers {
			n++
		}
		w := &benchWorker{}
		workers[i] = w
		chunks := make(chan []benchPending, 64)
		p := client.NewProducer(c, f.stream, opts)
		wg.Add(2)
		// Sender: paced (open loop) or full speed.
		go func() {
			defer wg.Done()
			defer close(chunks)
			var interval time.Duration
			if f.rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(f.producers) / f.rate)
			}
			chunk := make([]benchPending, 0, 256)
			lastHand := start
			for j := range n {
				var intended time.Time
				if interval > 0 {
					intended = start.Add(time.Duration(j) * interval)
					if d := time.Until(intended); d > 0 {
						time.Sleep(d)
					}
				} else {
					intended = time.Now()
				}
				var key []byte
				if len(keys) > 0 {
					key = keys[(i+j*f.producers)%len(keys)]
				}
				pd := benchPending{f: p.Send(ctx, client.Record{Key: key, Value: value}), intended: intended}
				if f.sync {
					_, _ = pd.f.Wait() // the collector takes the outcome
				}
				chunk = append(chunk, pd)
				if len(chunk) == cap(chunk) || (interval > 0 && time.Since(lastHand) > 50*time.Millisecond) {
					chunks <- chunk
					chunk = make([]benchPending, 0, 256)
					lastHand = time.Now()
				}
			}
			if len(chunk) > 0 {
				chunks <- chunk
			}
		}()
		// Collector: resolves futures in order; latency uses the time the
		// producer learned the outcome, not when the collector got there.
		go func() {
			defer wg.Done()
			defer p.Close()
			for chunk := range chunks {
				var ok, bad uint64
				for _, pd := range chunk {
					_, err := pd.f.Wait()
					at := pd.f.CompletedAt()
					if err != nil {
						bad++
						if w.firstErr == nil {
							w.firstErr = err
						}
					} else {
						ok++
						w.hist.record(at.Sub(pd.intended))
					}
					if at.After(w.lastAck) {
						w.lastAck = at
					}
				}
				w.errors += bad
				acked.Add(ok)
				failed.Add(bad)
			}
		}()
	}

	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	showProgress := f.progress || isTerminal(a.stderr)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-done:
			break loop
		case now := <-tick.C:
			if showProgress {
				n := acked.Load()
				el := now.Sub(start).Seconds()
				fmt.Fprintf(a.stderr, "bench: %d/%d records acked, %.0f records/s, %.1f MiB/s, %d errors\n",
					n, f.records, float64(n)/el, float64(n)*float64(f.recordSize)/el/(1<<20), failed.Load())
			}
		}
	}

	var hist histogram
	var res benchResult
	var firstErr error
	end := start
	for _, w := range workers {
		hist.merge(&w.hist)
		res.Errors += w.errors
		if firstErr == nil {
			firstErr = w.firstErr
		}
		if w.lastAck.After(end) {
			end = w.lastAck
		}
	}
	el := end.Sub(start).Seconds()
	if el <= 0 {
		el = time.Since(start).Seconds()
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	res.Records = hist.total
	res.Seconds = el
	res.RecordsPerSec = float64(hist.total) / el
	res.MiBPerSec = float64(hist.total) * float64(f.recordSize) / el / (1 << 20)
	res.P50Ms, res.P99Ms, res.P999Ms = ms(hist.quantile(0.50)), ms(hist.quantile(0.99)), ms(hist.quantile(0.999))
	res.MaxMs, res.MeanMs = ms(time.Duration(hist.max)), ms(hist.mean())
	res.Producers, res.RecordSize, res.TargetRate, res.Sync = f.producers, f.recordSize, f.rate, f.sync
	w := newJSONWriter(a.stdout)
	if err := w.write(res); err != nil {
		return err
	}
	if err := w.flush(); err != nil {
		return err
	}
	if res.Errors > 0 {
		return failuref("%d of %d records not acknowledged; first error: %s", res.Errors, f.records, grpcMessage(firstErr))
	}
	return nil
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
