package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/catena-streams/catena/client"
)

// check is a consistency checker for fault tests: it produces numbered
// records under load, then reads every partition back and verifies that
// each acknowledged record is stored exactly once, where its
// acknowledgement said, and in the order it was sent for its key.

type checkFlags struct {
	stream        string
	run           string
	duration      time.Duration
	records       int
	rate          float64
	keys          int
	maxInFlight   int
	retryTimeout  time.Duration
	verifyTimeout time.Duration
}

// checkReport is the final JSON line of catenactl check.
type checkReport struct {
	Run    string `json:"run"`
	Stream string `json:"stream"`
	// Sent, Acked and Failed count produce attempts: Failed records were
	// never acknowledged (they may or may not be stored).
	Sent   int `json:"sent"`
	Acked  int `json:"acked"`
	Failed int `json:"failed"`
	// Found is how many of the run's records the read-back saw.
	Found int `json:"found"`
	// Missing acknowledged records, Duplicates (a record of the run stored
	// more than once), Misplaced (stored elsewhere than its ack said) and
	// OutOfOrder (a key's records not in the order they were sent).
	Missing    int `json:"missing"`
	Duplicates int `json:"duplicates"`
	Misplaced  int `json:"misplaced"`
	OutOfOrder int `json:"out_of_order"`
	// UnackedStored are records whose produce failed but that are stored:
	// allowed (the ack was lost), reported for information.
	UnackedStored int     `json:"unacked_stored"`
	ProduceSecs   float64 `json:"produce_seconds"`
	VerifySecs    float64 `json:"verify_seconds"`
	OK            bool    `json:"ok"`
	// Problems lists the first few violations, for people.
	Problems []string `json:"problems,omitempty"`
}

// maxCheckProblems bounds the violations listed in a report.
const maxCheckProblems = 20

func newCheckCommand(a *app) *cobra.Command {
	var f checkFlags
	cmd := &cobra.Command{
		Use:   "check --stream S [--duration 60s | --records N] [--rate R] [--keys K]",
		Short: "Produce numbered records under load, read them back and verify none was lost, duplicated or reordered",
		Long: "Produce records keyed k0..k(K-1) with values RUN:SEQ for --duration (or\n" +
			"--records), one producer, paced at --rate, retrying each for --retry-timeout.\n" +
			"Then read every partition from the start up to its committed end and check\n" +
			"that every acknowledged record is stored exactly once, at the partition and\n" +
			"offset of its acknowledgement, and that each key's records are in the order\n" +
			"they were sent. Progress goes to stderr each second; the report is a final\n" +
			"JSON line on stdout. Exit 1 when a check fails (records that were never\n" +
			"acknowledged may be missing: they are counted, not failures).",
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.check(cmd, &f)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.stream, "stream", "", "stream to produce to and read back (required)")
	fl.StringVar(&f.run, "run", "", "run id, the prefix of every value (default: random)")
	fl.DurationVar(&f.duration, "duration", 30*time.Second, "how long to produce")
	fl.IntVar(&f.records, "records", 0, "stop after this many records (0 = only --duration)")
	fl.Float64Var(&f.rate, "rate", 200, "records per second (0 = as fast as acknowledgements allow)")
	fl.IntVar(&f.keys, "keys", 16, "distinct keys")
	fl.IntVar(&f.maxInFlight, "max-in-flight", 1, "produce requests in flight (1 keeps order across retries)")
	fl.DurationVar(&f.retryTimeout, "retry-timeout", 60*time.Second, "give up on a record after retrying this long")
	fl.DurationVar(&f.verifyTimeout, "verify-timeout", 2*time.Minute, "how long reading back may retry")
	return cmd
}

// ackedRecord is where an acknowledgement said a record is.
type ackedRecord struct {
	partition uint32
	offset    uint64
}

// storedRecord is one record of the run found in the log.
type storedRecord struct {
	seq       int
	key       string
	partition uint32
	offset    uint64
}

func (a *app) check(cmd *cobra.Command, f *checkFlags) error {
	if err := requireStream(f.stream); err != nil {
		return err
	}
	if f.keys < 1 {
		return usageErrorf("--keys must be at least 1")
	}
	if f.rate < 0 || f.records < 0 {
		return usageErrorf("--rate and --records must not be negative")
	}
	if f.run == "" {
		f.run = fmt.Sprintf("run%08x", rand.Uint32())
	}
	if strings.Contains(f.run, ":") {
		return usageErrorf("--run must not contain ':'")
	}
	ctx := cmd.Context()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()

	rep := checkReport{Run: f.run, Stream: f.stream}
	start := time.Now()
	acked, sent, failed := a.checkProduce(ctx, c, f)
	rep.Sent, rep.Acked, rep.Failed = sent, len(acked), failed
	rep.ProduceSecs = time.Since(start).Seconds()

	vstart := time.Now()
	stored, err := readRun(ctx, c, f.stream, f.run, f.verifyTimeout)
	rep.VerifySecs = time.Since(vstart).Seconds()
	if err != nil {
		return failure(fmt.Errorf("failed to read back stream %q: %w", f.stream, err))
	}
	verifyRun(&rep, acked, stored)
	out := newJSONWriter(a.stdout)
	if err := out.write(rep); err != nil {
		return failure(err)
	}
	if err := out.flush(); err != nil {
		return failure(err)
	}
	if !rep.OK {
		return failuref("check failed: %d missing, %d duplicates, %d misplaced, %d out of order", rep.Missing, rep.Duplicates, rep.Misplaced, rep.OutOfOrder)
	}
	return nil
}

// checkProduce sends records until the duration or count is reached and
// returns the acknowledged ones by sequence number.
func (a *app) checkProduce(ctx context.Context, c *client.Client, f *checkFlags) (acked map[int]ackedRecord, sent, failed int) {
	p := client.NewProducer(c, f.stream, client.ProducerOptions{MaxInFlight: f.maxInFlight, RetryTimeout: f.retryTimeout})
	type pending struct {
		seq int
		fut *client.Future
	}
	queue := make(chan pending, 1<<16)
	acked = map[int]ackedRecord{}
	done := make(chan struct{})
	var lastErr error
	go func() {
		defer close(done)
		for pr := range queue {
			ack, err := pr.fut.Wait()
			if err != nil {
				failed++
				lastErr = err
				continue
			}
			acked[pr.seq] = ackedRecord{partition: ack.Partition, offset: ack.Offset}
		}
	}()

	end := time.Now().Add(f.duration)
	var tick <-chan time.Time
	if f.rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / f.rate))
		defer t.Stop()
		tick = t.C
	}
	progress := time.NewTicker(time.Second)
	defer progress.Stop()
	for seq := 0; ctx.Err() == nil && time.Now().Before(end) && (f.records == 0 || seq < f.records); seq++ {
		if tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				continue
			}
		}
		select {
		case <-progress.C:
			fmt.Fprintf(a.stderr, "check: run %s sent %d\n", f.run, seq)
		default:
		}
		key := "k" + strconv.Itoa(seq%f.keys)
		fut := p.Send(ctx, client.Record{Key: []byte(key), Value: []byte(f.run + ":" + strconv.Itoa(seq))})
		queue <- pending{seq: seq, fut: fut}
		sent++
	}
	close(queue)
	<-done
	_ = p.Close()
	if lastErr != nil {
		fmt.Fprintf(a.stderr, "check: %d records not acknowledged, last: %s\n", failed, grpcMessage(lastErr))
	}
	fmt.Fprintf(a.stderr, "check: run %s sent %d, acknowledged %d, failed %d\n", f.run, sent, len(acked), failed)
	return acked, sent, failed
}

// readRun reads every partition of the stream from its first offset to
// its committed end and returns the run's records in log order. Reads are
// retried until timeout: a chain may be reconfiguring.
func readRun(ctx context.Context, c *client.Client, stream, run string, timeout time.Duration) ([]storedRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var parts int
	if err := retryRead(ctx, func() error {
		d, err := c.Describe(ctx, stream)
		if err != nil {
			return err
		}
		parts = len(d.Partitions)
		if d.Config != nil && int(d.Config.Partitions) > parts {
			parts = int(d.Config.Partitions)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	prefix := run + ":"
	var out []storedRecord
	for p := range uint32(parts) {
		var next, end uint64
		if err := retryRead(ctx, func() error {
			var err error
			if next, err = c.Resolve(ctx, stream, p, client.Earliest); err != nil {
				return err
			}
			end, err = c.Resolve(ctx, stream, p, client.Latest)
			return err
		}); err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, err)
		}
		for next < end {
			var res *client.FetchResult
			if err := retryRead(ctx, func() error {
				var err error
				res, err = c.Fetch(ctx, stream, p, next, 0, 0)
				return err
			}); err != nil {
				return nil, fmt.Errorf("partition %d at offset %d: %w", p, next, err)
			}
			for _, m := range res.Messages {
				v := string(m.Value)
				if !strings.HasPrefix(v, prefix) {
					continue
				}
				seq, err := strconv.Atoi(v[len(prefix):])
				if err != nil {
					continue
				}
				out = append(out, storedRecord{seq: seq, key: string(m.Key), partition: m.Partition, offset: m.Offset})
			}
			if res.NextOffset <= next {
				// Nothing new yet from the replica that answered: ask again.
				select {
				case <-ctx.Done():
					return nil, fmt.Errorf("partition %d: no progress at offset %d (committed end %d): %w", p, next, end, ctx.Err())
				case <-time.After(checkReadRetry):
				}
				continue
			}
			next = res.NextOffset
		}
	}
	return out, nil
}

// checkReadRetry is the pause between read attempts while a chain is
// being repaired.
const checkReadRetry = 200 * time.Millisecond

func retryRead(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(checkReadRetry):
		}
	}
}

// verifyRun fills the report's verdict from what was acknowledged and what
// was stored (in log order per partition). It is pure, so it is
// table-tested.
func verifyRun(rep *checkReport, acked map[int]ackedRecord, stored []storedRecord) {
	problem := func(format string, args ...any) {
		if len(rep.Problems) < maxCheckProblems {
			rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...))
		}
	}
	rep.Found = len(stored)
	seen := map[int]int{}
	lastSeqOfKey := map[string]int{}
	for _, s := range stored {
		seen[s.seq]++
		if seen[s.seq] == 2 {
			rep.Duplicates++
			problem("record %d stored more than once (again at partition %d offset %d)", s.seq, s.partition, s.offset)
		}
		if a, ok := acked[s.seq]; ok && seen[s.seq] == 1 && (a.partition != s.partition || a.offset != s.offset) {
			rep.Misplaced++
			problem("record %d acknowledged at partition %d offset %d but stored at partition %d offset %d", s.seq, a.partition, a.offset, s.partition, s.offset)
		}
		if last, ok := lastSeqOfKey[s.key]; ok && s.seq <= last && seen[s.seq] == 1 {
			rep.OutOfOrder++
			problem("key %s: record %d stored after record %d", s.key, s.seq, last)
		}
		if last, ok := lastSeqOfKey[s.key]; !ok || s.seq > last {
			lastSeqOfKey[s.key] = s.seq
		}
		if _, ok := acked[s.seq]; !ok && seen[s.seq] == 1 {
			rep.UnackedStored++
		}
	}
	missing := make([]int, 0)
	for seq := range acked {
		if seen[seq] == 0 {
			missing = append(missing, seq)
		}
	}
	slices.Sort(missing)
	rep.Missing = len(missing)
	for _, seq := range missing {
		a := acked[seq]
		problem("record %d acknowledged at partition %d offset %d is missing", seq, a.partition, a.offset)
	}
	rep.OK = rep.Missing == 0 && rep.Duplicates == 0 && rep.Misplaced == 0 && rep.OutOfOrder == 0
}
