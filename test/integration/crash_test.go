package integration

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/catena-streams/catena/client"
)

// TestKillNineAllAndRestart checks "an acknowledged record is never lost
// while a member that stored it survives with its volume, and is never
// returned twice" across a power-cut of the whole cluster (every replica
// and the dev process SIGKILLed mid-load, SCENARIOS.md 8 and 16 at their
// extreme): after a restart on the same data directory every acked record
// is at its acked offset with its key and value, nothing is stored twice,
// offsets are dense, chain members agree (checksums), and new records are
// appended after the old ones.
func TestKillNineAllAndRestart(t *testing.T) {
	const (
		producers      = 3
		keys           = 30
		killAfter      = 4000 // acks received in all before the kill
		window         = 1500 // unresolved futures per producer
		partitions     = 4
		maxPerProducer = 20000
	)
	dataDir := t.TempDir()
	d := startDev(t, dataDir)
	stream := d.state.Stream

	var (
		ackCount atomic.Int64
		killed   = make(chan struct{})
		killOnce sync.Once
		mu       sync.Mutex
		all      []*sent // every record sent
	)
	sendCtx, stopSending := context.WithCancel(context.Background())
	defer stopSending()
	var wg sync.WaitGroup
	for pi := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Short retry bounds: after the kill, unacknowledged records
			// must fail quickly rather than retry for 30s.
			prod := client.NewProducer(d.client, stream, client.ProducerOptions{RetryTimeout: 2 * time.Second, RequestTimeout: 2 * time.Second})
			defer prod.Close()
			counters := make([]int, keys)
			type pending struct {
				s *sent
				f *client.Future
			}
			var queue []pending
			resolve := func(p pending) {
				p.s.ack, p.s.err = p.f.Wait()
				p.s.seq = p.f.Sequence()
				if p.s.err == nil && ackCount.Add(1) == killAfter {
					killOnce.Do(func() { close(killed) })
				}
			}
			for i := 0; i < maxPerProducer && sendCtx.Err() == nil; i++ {
				k := i % keys
				counters[k]++
				s := &sent{producer: pi, key: k, counter: counters[k], keyB: keyOf(pi, k), val: valueOf(pi, k, counters[k])}
				mu.Lock()
				all = append(all, s)
				mu.Unlock()
				queue = append(queue, pending{s, prod.Send(sendCtx, client.Record{Key: s.keyB, Value: s.val})})
				if len(queue) >= window {
					resolve(queue[0])
					queue = queue[1:]
				}
			}
			for _, p := range queue {
				resolve(p)
			}
		}()
	}

	select {
	case <-killed:
	case <-time.After(60 * time.Second):
		t.Fatalf("only %d acks after 60s", ackCount.Load())
	}
	d.kill9All()
	stopSending()
	wg.Wait()

	acked := map[partOff]*sent{}
	failed := 0
	for _, s := range all {
		if s.err != nil {
			failed++
			continue
		}
		at := partOff{s.ack.Partition, s.ack.Offset}
		if prev := acked[at]; prev != nil {
			t.Fatalf("two records acked at partition %d offset %d: %s and %s", at.p, at.off, prev.val, s.val)
		}
		acked[at] = s
	}
	t.Logf("before the kill: %d records acked, %d failed or unresolved", len(acked), failed)
	if len(acked) < killAfter {
		t.Fatalf("only %d acked records", len(acked))
	}

	// Restart on the same data directory.
	d2 := startDev(t, dataDir)
	waitConverged(t, d2.seeds(), stream, partitions, 60*time.Second)
	got, ends := readAll(t, d2.client, stream, partitions)
	for at, s := range acked {
		m, ok := got[at]
		switch {
		case !ok:
			t.Errorf("acked record %s at partition %d offset %d lost (partition end %d)", s.val, at.p, at.off, ends[at.p])
		case !bytes.Equal(m.Key, s.keyB) || !bytes.Equal(m.Value, s.val):
			t.Errorf("partition %d offset %d holds %q=%q, acked %q=%q", at.p, at.off, m.Key, m.Value, s.keyB, s.val)
		}
	}
	// Unacked records may have been stored (their acks were lost), but
	// never twice, and nothing that was not sent.
	sentVals := map[string]bool{}
	for _, s := range all {
		sentVals[string(s.val)] = true
	}
	seen := map[string]partOff{}
	for at, m := range got {
		if !sentVals[string(m.Value)] {
			t.Errorf("partition %d offset %d holds %q=%q, which no producer sent", at.p, at.off, m.Key, m.Value)
		}
		if prev, dup := seen[string(m.Value)]; dup {
			t.Errorf("record %q stored twice: partition %d offset %d and partition %d offset %d", m.Value, prev.p, prev.off, at.p, at.off)
		}
		seen[string(m.Value)] = at
	}

	// Offsets continue after the old records.
	prod := client.NewProducer(d2.client, stream, client.ProducerOptions{})
	defer prod.Close()
	var futs []*client.Future
	var more []*sent
	for i := range 200 {
		s := &sent{producer: 99, key: i % keys, counter: i, keyB: keyOf(99, i%keys), val: valueOf(99, i%keys, i)}
		more = append(more, s)
		futs = append(futs, prod.Send(context.Background(), client.Record{Key: s.keyB, Value: s.val}))
	}
	for i, f := range futs {
		ack, err := f.Wait()
		if err != nil {
			t.Fatalf("produce after restart: %v", err)
		}
		if ack.Offset < ends[ack.Partition] {
			t.Errorf("record produced after restart acked at partition %d offset %d, below the old end %d", ack.Partition, ack.Offset, ends[ack.Partition])
		}
		more[i].ack = ack
	}
	got2, ends2 := readAll(t, d2.client, stream, partitions)
	for p := range partitions {
		if ends2[p] < ends[p] {
			t.Errorf("partition %d: committed end went back from %d to %d", p, ends[p], ends2[p])
		}
	}
	for at, m := range got {
		if m2 := got2[at]; !bytes.Equal(m2.Value, m.Value) {
			t.Errorf("partition %d offset %d changed from %q to %q", at.p, at.off, m.Value, m2.Value)
		}
	}
	for _, s := range more {
		if m := got2[partOff{s.ack.Partition, s.ack.Offset}]; !bytes.Equal(m.Value, s.val) {
			t.Errorf("record acked after restart at %d/%d reads back %q, want %q", s.ack.Partition, s.ack.Offset, m.Value, s.val)
		}
	}
	waitConverged(t, d2.seeds(), stream, partitions, 30*time.Second)
}
