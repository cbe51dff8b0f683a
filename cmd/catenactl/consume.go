package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/catena-streams/catena/client"
)

type consumeFlags struct {
	stream    string
	partition uint32
	from      string
	count     int
	noFollow  bool
	maxBytes  uint32
	group     string
}

type messageLine struct {
	Stream      string `json:"stream"`
	Partition   uint32 `json:"partition"`
	Offset      uint64 `json:"offset"`
	Key         string `json:"key"`
	KeyB64      string `json:"key_b64,omitempty"`
	Value       string `json:"value"`
	ValueB64    string `json:"value_b64,omitempty"`
	TimestampMs int64  `json:"timestamp_ms"`
	// Headers in order, as the key's and value's text (value_b64 when the
	// value is not UTF-8).
	Headers []headerLine `json:"headers,omitempty"`
}

type headerLine struct {
	Key      string `json:"key"`
	Value    string `json:"value"`
	ValueB64 string `json:"value_b64,omitempty"`
}

func headerLines(hs []client.Header) []headerLine {
	var out []headerLine
	for _, h := range hs {
		v, vb := textField(h.Value)
		out = append(out, headerLine{Key: h.Key, Value: v, ValueB64: vb})
	}
	return out
}

func newConsumeCommand(a *app) *cobra.Command {
	var f consumeFlags
	cmd := &cobra.Command{
		Use:   "consume --stream S [--partition P | --group G] [--from earliest|latest|OFFSET|@TIMESTAMP_MS] [--count N] [--no-follow]",
		Short: "Print committed records as JSON lines",
		Long: "Print committed records, one JSON line each. Without --partition every\n" +
			"partition is read (per-partition order is preserved; partitions interleave).\n" +
			"--from OFFSET applies to each partition read. With --no-follow the command\n" +
			"exits once each partition reached the committed offset seen at start;\n" +
			"otherwise it follows until interrupted (SIGINT/SIGTERM) or --count records.\n" +
			"With --group the command is a member of that consumer group (the same\n" +
			"groups as Kafka clients'): it reads the partitions the group gives it, from\n" +
			"the group's committed offsets (--from for partitions never committed), and\n" +
			"commits each record once printed; it leaves the group on exit.",
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.consume(cmd, &f)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.stream, "stream", "", "stream to read (required)")
	fl.Uint32Var(&f.partition, "partition", 0, "read only this partition (default: all)")
	fl.StringVar(&f.from, "from", "earliest", "start position: earliest, latest, OFFSET or @UNIX_MS")
	fl.IntVar(&f.count, "count", 0, "stop after N records (0 = no limit)")
	fl.BoolVar(&f.noFollow, "no-follow", false, "exit once caught up with the committed offset at start")
	fl.Uint32Var(&f.maxBytes, "max-bytes", 0, "max bytes per streamed response (0 = server default)")
	fl.StringVar(&f.group, "group", "", "consume as a member of this consumer group, committing what is printed")
	return cmd
}

func (a *app) consume(cmd *cobra.Command, f *consumeFlags) error {
	if err := requireStream(f.stream); err != nil {
		return err
	}
	pos, err := client.ParsePosition(f.from)
	if err != nil {
		return usageErrorf("bad --from: %v", err)
	}
	if f.count < 0 {
		return usageErrorf("--count must be >= 0")
	}
	if f.group != "" && (cmd.Flags().Changed("partition") || f.noFollow) {
		return usageErrorf("--group reads the partitions the group assigns and follows them: it takes neither --partition nor --no-follow")
	}
	parent := cmd.Context()
	c, err := a.dial(parent)
	if err != nil {
		return err
	}
	defer c.Close()
	if f.group != "" {
		return a.consumeGroup(parent, c, f, pos)
	}

	var parts []uint32
	if cmd.Flags().Changed("partition") {
		parts = []uint32{f.partition}
	} else {
		d, err := c.Describe(parent, f.stream)
		if err != nil {
			return failure(err)
		}
		n := len(d.Partitions)
		if d.Config != nil && int(d.Config.Partitions) > n {
			n = int(d.Config.Partitions)
		}
		if n == 0 {
			return failuref("stream %q has no partitions", f.stream)
		}
		for p := range n {
			parts = append(parts, uint32(p))
		}
	}

	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	out := make(chan client.Message, 1024)
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	fail := func(p uint32, err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil {
			firstErr = fmt.Errorf("partition %d: %s", p, grpcMessage(err))
		}
		cancel()
	}
	for _, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.consumePartition(ctx, c, f, p, pos, out); err != nil && ctx.Err() == nil {
				fail(p, err)
			}
		}()
	}
	go func() {
		wg.Wait()
		close(out)
	}()

	w := newJSONWriter(a.stdout)
	printed := 0
	var writeErr error
	for m := range out {
		if f.count > 0 && printed >= f.count {
			continue // draining after cancel
		}
		k, kb := textField(m.Key)
		v, vb := textField(m.Value)
		if err := w.write(messageLine{Stream: m.Stream, Partition: m.Partition, Offset: m.Offset, Key: k, KeyB64: kb, Value: v, ValueB64: vb, TimestampMs: m.TimestampMs, Headers: headerLines(m.Headers)}); err != nil && writeErr == nil {
			writeErr = err
			cancel()
		}
		printed++
		if f.count > 0 && printed >= f.count {
			cancel()
		}
		if len(out) == 0 {
			if err := w.flush(); err != nil && writeErr == nil {
				writeErr = err
				cancel()
			}
		}
	}
	if err := w.flush(); err != nil && writeErr == nil {
		writeErr = err
	}
	switch {
	case firstErr != nil:
		return failure(firstErr)
	case writeErr != nil:
		return failure(writeErr)
	}
	// Interrupted (SIGINT/SIGTERM) or --count reached: a clean end.
	return nil
}

// consumePartition streams one partition into out until ctx is done or,
// with --no-follow, the committed offset seen at start is reached.
func (a *app) consumePartition(ctx context.Context, c *client.Client, f *consumeFlags, p uint32, pos client.Position, out chan<- client.Message) error {
	var target uint64
	if f.noFollow {
		var err error
		if target, err = c.Resolve(ctx, f.stream, p, client.Latest); err != nil {
			return err
		}
	}
	start, err := c.Resolve(ctx, f.stream, p, pos)
	if err != nil {
		return err
	}
	if f.noFollow && start >= target {
		return nil
	}
	sub, err := c.Subscribe(ctx, f.stream, p, client.AtOffset(start), client.SubscribeOptions{MaxBytes: f.maxBytes})
	if err != nil {
		return err
	}
	defer sub.Close()
	for {
		m, err := sub.Next()
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case out <- m:
		case <-ctx.Done():
			return nil
		}
		if f.noFollow && m.Offset+1 >= target {
			return nil
		}
	}
}

// consumeGroup prints records as a member of f.group and commits each
// batch's printed records.
func (a *app) consumeGroup(ctx context.Context, c *client.Client, f *consumeFlags, pos client.Position) error {
	g, err := c.JoinGroup(ctx, client.GroupOptions{Group: f.group, Stream: f.stream, ClientID: "catenactl", Start: pos, MaxBytes: f.maxBytes})
	if err != nil {
		return usageError(err)
	}
	defer func() {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = g.Close(lctx)
	}()
	w := newJSONWriter(a.stdout)
	printed := 0
	for f.count == 0 || printed < f.count {
		msgs, err := g.Poll(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted
			}
			return failure(err)
		}
		if f.count > 0 && len(msgs) > f.count-printed {
			msgs = msgs[:f.count-printed]
		}
		for _, m := range msgs {
			k, kb := textField(m.Key)
			v, vb := textField(m.Value)
			if err := w.write(messageLine{Stream: m.Stream, Partition: m.Partition, Offset: m.Offset, Key: k, KeyB64: kb, Value: v, ValueB64: vb, TimestampMs: m.TimestampMs, Headers: headerLines(m.Headers)}); err != nil {
				return err
			}
		}
		if err := w.flush(); err != nil {
			return err
		}
		printed += len(msgs)
		// A commit refused by a rebalance leaves the records to their next
		// reader: at least once.
		if err := g.CommitMessages(ctx, msgs...); err != nil && ctx.Err() == nil {
			fmt.Fprintf(a.stderr, "catenactl: commit: %s\n", grpcMessage(err))
		}
	}
	return nil
}
