package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/catena-streams/catena/client"
)

const maxLineBytes = 16 << 20

type produceFlags struct {
	stream       string
	key          string
	keyed        bool
	partition    uint32
	values       []string
	headers      []string
	linger       time.Duration
	retryTimeout time.Duration
}

type ackLine struct {
	Stream    string `json:"stream"`
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
	Key       string `json:"key"`
	KeyB64    string `json:"key_b64,omitempty"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

func newProduceCommand(a *app) *cobra.Command {
	var f produceFlags
	cmd := &cobra.Command{
		Use:   "produce --stream S [--key K | --keyed] [--partition P] [--value V ...]",
		Short: "Produce records from --value flags or stdin lines",
		Long: "Produce records to a stream. Values come from repeated --value flags or,\n" +
			"without them, one per stdin line. With --keyed each stdin line is KEY<TAB>VALUE.\n" +
			"Prints one JSON line per acknowledged record, in input order.",
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.produce(cmd, &f)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.stream, "stream", "", "stream to produce to (required)")
	fl.StringVar(&f.key, "key", "", "key of every record")
	fl.BoolVar(&f.keyed, "keyed", false, "stdin lines are KEY<TAB>VALUE")
	fl.Uint32Var(&f.partition, "partition", 0, "explicit partition (default: the server routes by key)")
	fl.StringArrayVar(&f.values, "value", nil, "record value (repeatable); stdin is not read when given")
	fl.StringArrayVar(&f.headers, "header", nil, "KEY=VALUE header of every record (repeatable; a key may repeat)")
	fl.DurationVar(&f.linger, "linger", time.Millisecond, "batching delay")
	fl.DurationVar(&f.retryTimeout, "retry-timeout", 30*time.Second, "give up on a record after retrying this long")
	return cmd
}

type pendingRecord struct {
	f     *client.Future
	label string
}

func (a *app) produce(cmd *cobra.Command, f *produceFlags) error {
	if err := requireStream(f.stream); err != nil {
		return err
	}
	keySet := cmd.Flags().Changed("key")
	if keySet && f.keyed {
		return usageErrorf("--key and --keyed are mutually exclusive")
	}
	if f.keyed && len(f.values) > 0 {
		return usageErrorf("--keyed reads KEY<TAB>VALUE lines from stdin; it cannot be combined with --value")
	}
	var headers []client.Header
	for _, h := range f.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return usageErrorf("bad --header %q: want KEY=VALUE", h)
		}
		headers = append(headers, client.Header{Key: k, Value: []byte(v)})
	}
	var partition *uint32
	if cmd.Flags().Changed("partition") {
		partition = client.PartitionOf(f.partition)
	}
	ctx := cmd.Context()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	linger := f.linger
	if linger <= 0 {
		linger = -1
	}
	p := client.NewProducer(c, f.stream, client.ProducerOptions{Linger: linger, RetryTimeout: f.retryTimeout})

	// The printer resolves futures in input order while the reader keeps
	// sending, so requests stay pipelined.
	queue := make(chan pendingRecord, 4096)
	var failed atomic.Bool
	var nFailed int
	var firstFailure error
	var wg sync.WaitGroup
	wg.Add(1)
	var writeErr error
	go func() {
		defer wg.Done()
		out := newJSONWriter(a.stdout)
		defer func() {
			if err := out.flush(); err != nil && writeErr == nil {
				writeErr = err
			}
		}()
		for pr := range queue {
			ack, err := pr.f.Wait()
			if err != nil {
				failed.Store(true)
				nFailed++
				if firstFailure == nil {
					firstFailure = fmt.Errorf("record %s not acknowledged: %s", pr.label, grpcMessage(err))
				}
				// The first failure is the command's error (printed once
				// at exit); a few more are listed as they happen.
				if nFailed > 1 && nFailed <= 10 {
					fmt.Fprintf(a.stderr, "catenactl: record %s not acknowledged: %s\n", pr.label, grpcMessage(err))
				}
				continue
			}
			k, kb := textField(ack.Key)
			if err := out.write(ackLine{Stream: ack.Stream, Partition: ack.Partition, Offset: ack.Offset, Key: k, KeyB64: kb, Duplicate: ack.Duplicate}); err != nil && writeErr == nil {
				writeErr = err
			}
			if len(queue) == 0 {
				if err := out.flush(); err != nil && writeErr == nil {
					writeErr = err
				}
			}
		}
	}()

	send := func(key, value []byte, label string) {
		fut := p.Send(ctx, client.Record{Key: key, Value: value, Partition: partition, Headers: headers})
		queue <- pendingRecord{f: fut, label: label}
	}
	var fixedKey []byte
	if keySet {
		fixedKey = []byte(f.key)
	}
	var inputErr error
	if len(f.values) > 0 {
		for i, v := range f.values {
			if failed.Load() {
				break
			}
			send(fixedKey, []byte(v), fmt.Sprintf("%d (--value #%d)", i+1, i+1))
		}
	} else {
		inputErr = a.readLines(f.keyed, fixedKey, failed.Load, func(key, value []byte, line int) {
			send(key, value, fmt.Sprintf("on line %d", line))
		})
	}
	close(queue)
	wg.Wait()
	_ = p.Close()
	switch {
	case inputErr != nil:
		return inputErr
	case firstFailure != nil:
		if nFailed > 1 {
			return failuref("%v (and %d more records failed)", firstFailure, nFailed-1)
		}
		return failure(firstFailure)
	case writeErr != nil:
		return failure(writeErr)
	case ctx.Err() != nil:
		return failure(ctx.Err())
	}
	return nil
}

// readLines calls emit for every stdin line (without its newline), split at
// the first TAB when keyed. A keyed line without a TAB stops the input with
// a usage error naming the line.
func (a *app) readLines(keyed bool, fixedKey []byte, stop func() bool, emit func(key, value []byte, line int)) error {
	sc := bufio.NewScanner(a.stdin)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	line := 0
	for sc.Scan() {
		line++
		if stop() {
			return nil
		}
		// The producer keeps references until acknowledged: copy.
		b := bytes.Clone(sc.Bytes())
		if b == nil {
			b = []byte{}
		}
		if !keyed {
			emit(fixedKey, b, line)
			continue
		}
		k, v, ok := bytes.Cut(b, []byte{'\t'})
		if !ok {
			return usageErrorf("line %d: no TAB between key and value (--keyed expects KEY<TAB>VALUE)", line)
		}
		emit(k, v, line)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return usageErrorf("line %d: longer than %d bytes", line+1, maxLineBytes)
		}
		return failure(fmt.Errorf("reading stdin: %w", err))
	}
	return nil
}
