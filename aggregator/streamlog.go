package aggregator

import (
	"context"
	"fmt"
	"sync"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// StreamLog is the checkpoint stream in Catena: appends through an
// idempotent producer (a retried chunk is stored once), reads of
// committed records through Fetch.
type StreamLog struct {
	c      *client.Client
	stream string

	once sync.Once
	prod *client.Producer
}

// NewStreamLog uses stream through c.
func NewStreamLog(c *client.Client, stream string) *StreamLog {
	return &StreamLog{c: c, stream: stream}
}

func (l *StreamLog) producer() *client.Producer {
	l.once.Do(func() {
		l.prod = client.NewProducer(l.c, l.stream, client.ProducerOptions{MaxBatchBytes: 2 << 20})
	})
	return l.prod
}

// Append implements Log.
func (l *StreamLog) Append(ctx context.Context, partition uint32, values [][]byte) ([]uint64, error) {
	p := l.producer()
	fs := make([]*client.Future, len(values))
	for i, v := range values {
		fs[i] = p.Send(ctx, client.Record{Value: v, Partition: client.PartitionOf(partition)})
	}
	offs := make([]uint64, len(values))
	for i, f := range fs {
		ack, err := f.Wait()
		if err != nil {
			return nil, err
		}
		offs[i] = ack.Offset
	}
	return offs, nil
}

// Read implements Log. Records before the partition's log start were
// trimmed by retention; reading starts at the log start then.
func (l *StreamLog) Read(ctx context.Context, partition uint32, from uint64, fn func(uint64, []byte) error) error {
	end := uint64(0)
	first := true
	for off := from; first || off < end; {
		res, err := l.c.Fetch(ctx, l.stream, partition, off, 16<<20, 0)
		if err != nil {
			if first && from > 0 {
				// A start before the log's start: begin at the log start.
				start, serr := l.Start(ctx, partition)
				if serr == nil && start > off {
					off = start
					continue
				}
			}
			return fmt.Errorf("failed to read %s/%d at %d: %w", l.stream, partition, off, err)
		}
		if first {
			end, first = res.Committed, false
		}
		for _, m := range res.Messages {
			if m.Offset >= end {
				return nil
			}
			if err := fn(m.Offset, m.Value); err != nil {
				return err
			}
		}
		if res.NextOffset <= off {
			if off < end {
				return fmt.Errorf("read of %s/%d made no progress at %d (committed %d)", l.stream, partition, off, end)
			}
			return nil
		}
		off = res.NextOffset
	}
	return nil
}

// Start implements Log.
func (l *StreamLog) Start(ctx context.Context, partition uint32) (uint64, error) {
	return l.c.ListOffsets(ctx, l.stream, partition, catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST, 0)
}

// Close flushes and stops the producer.
func (l *StreamLog) Close() {
	if l.prod != nil {
		l.prod.Close()
	}
}
