package integration

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// TestConsumersNeverSeeUncommitted checks "a consumer sees only committed
// records" and "a member serves reads only up to the committed offset it
// knows, never further, even if it holds more" (DESIGN.md): with the tail
// paused (SIGSTOP), a record appended by the head and the middle is not
// served by the head, the middle, Ingest Fetch or Subscribe; once the tail
// resumes (SIGCONT) it commits, the producer is answered, and it is served.
func TestConsumersNeverSeeUncommitted(t *testing.T) {
	const partition = 0
	// The paused tail must stay in the chain for the whole check: with the
	// default failure timeout (1 s) the master would remove it, and the
	// head and middle would commit the record while the reads below run.
	d := startDev(t, t.TempDir(), "--failure-timeout", "5m")
	stream := d.state.Stream

	// Something committed first, so the partition is not empty.
	prod := client.NewProducer(d.client, stream, client.ProducerOptions{})
	t.Cleanup(func() { _ = prod.Close() })
	for i := range 5 {
		if _, err := prod.SendSync(ctxT(t, 30*time.Second), client.Record{Key: []byte("warm"), Value: []byte(fmt.Sprint(i)), Partition: client.PartitionOf(partition)}); err != nil {
			t.Fatalf("warm-up produce: %v", err)
		}
	}

	desc, err := d.client.Describe(ctxT(t, 10*time.Second), stream)
	if err != nil {
		t.Fatal(err)
	}
	members := desc.GetPartitions()[partition].GetMembers()
	if len(members) != 3 {
		t.Fatalf("partition %d has chain %v, want 3 members", partition, members)
	}
	head, middle, tail := members[0], members[1], members[2]
	tailPID := d.replica(tail.GetId()).PID
	headRC, middleRC := replicaClient(t, head.GetAddr()), replicaClient(t, middle.GetAddr())

	before, err := partStatus(ctxT(t, 5*time.Second), headRC, stream, partition)
	if err != nil {
		t.Fatal(err)
	}
	pending := before.GetCommitted()
	if before.GetLogEnd() != pending {
		t.Fatalf("head not quiet before the test: %v", before)
	}

	// A subscriber from the pending offset on, running throughout.
	subCtx, stopSub := context.WithCancel(context.Background())
	t.Cleanup(stopSub)
	sub, err := d.client.Subscribe(subCtx, stream, partition, client.AtOffset(pending))
	if err != nil {
		t.Fatal(err)
	}
	delivered := make(chan client.Message, 16)
	go func() {
		for m, err := range sub.All() {
			if err != nil {
				return
			}
			delivered <- m
		}
	}()

	// Pause the tail; SIGCONT always, even if the test fails.
	t.Cleanup(func() { _ = syscall.Kill(tailPID, syscall.SIGCONT) })
	if err := syscall.Kill(tailPID, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP tail %s (pid %d): %v", tail.GetId(), tailPID, err)
	}
	key, val := []byte("pending-key"), []byte("pending-value")
	fut := prod.Send(context.Background(), client.Record{Key: key, Value: val, Partition: client.PartitionOf(partition)})

	// The head (and the middle) hold it, but it cannot commit.
	eventually(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, rc := range []catenapb.ReplicaClient{headRC, middleRC} {
			st, err := partStatus(ctx, rc, stream, partition)
			if err != nil {
				return err
			}
			if st.GetLogEnd() <= pending {
				return fmt.Errorf("%s: log_end %d, waiting for the record at %d", st.GetReplicaId(), st.GetLogEnd(), pending)
			}
			if st.GetCommitted() > pending {
				t.Fatalf("%s reports committed %d with the tail paused (pending offset %d)", st.GetReplicaId(), st.GetCommitted(), pending)
			}
		}
		return nil
	})
	select {
	case <-fut.Done():
		ack, err := fut.Result()
		t.Fatalf("produce answered while the tail is paused: ack %+v err %v", ack, err)
	default:
	}

	for name, rc := range map[string]catenapb.ReplicaClient{"head " + head.GetId(): headRC, "middle " + middle.GetId(): middleRC} {
		for _, from := range []uint64{0, pending} {
			resp, err := rc.Read(ctxT(t, 5*time.Second), &catenapb.FetchRequest{Stream: stream, Partition: partition, Offset: from, MaxWaitMs: 0})
			if err != nil {
				t.Fatalf("Read from %s at %d: %v", name, from, err)
			}
			if resp.GetCommitted() > pending {
				t.Errorf("Read from %s: committed %d, but offset %d is not committed", name, resp.GetCommitted(), pending)
			}
			for _, r := range resp.GetRecords() {
				if r.GetOffset() >= pending {
					t.Errorf("Read from %s at %d returned uncommitted offset %d (%q)", name, from, r.GetOffset(), r.GetValue())
				}
			}
			if resp.GetNextOffset() > pending {
				t.Errorf("Read from %s at %d: next_offset %d is past the committed end %d", name, from, resp.GetNextOffset(), pending)
			}
		}
	}
	// Ingest Fetch: it may fail while the tail (read first) is paused, but
	// it must never return the pending record.
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	res, err := d.client.Fetch(fctx, stream, partition, pending, 0, 0)
	cancel()
	if err != nil {
		t.Logf("Ingest Fetch with the tail paused failed (allowed, not a safety issue): %v", err)
	} else {
		for _, m := range res.Messages {
			if m.Offset >= pending {
				t.Errorf("Ingest Fetch returned uncommitted offset %d (%q)", m.Offset, m.Value)
			}
		}
	}
	select {
	case m := <-delivered:
		t.Fatalf("Subscribe delivered offset %d (%q) while it is uncommitted", m.Offset, m.Value)
	default:
	}

	// Resume the tail: the record commits, the producer is answered and
	// consumers see it.
	if err := syscall.Kill(tailPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var ack client.Ack
	select {
	case <-fut.Done():
		if ack, err = fut.Result(); err != nil {
			t.Fatalf("produce failed after the tail resumed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("produce not answered 30s after the tail resumed")
	}
	if ack.Partition != partition || ack.Offset != pending {
		t.Fatalf("ack at %d/%d, want %d/%d", ack.Partition, ack.Offset, partition, pending)
	}
	select {
	case m := <-delivered:
		if m.Offset != pending || !bytes.Equal(m.Key, key) || !bytes.Equal(m.Value, val) {
			t.Fatalf("Subscribe delivered %d %q=%q, want %d %q=%q", m.Offset, m.Key, m.Value, pending, key, val)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Subscribe did not deliver the record 30s after it committed")
	}
	eventually(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := d.client.Fetch(ctx, stream, partition, pending, 0, 0)
		if err != nil {
			return err
		}
		if len(res.Messages) != 1 || res.Messages[0].Offset != pending || !bytes.Equal(res.Messages[0].Value, val) {
			return fmt.Errorf("fetch at %d: %+v", pending, res)
		}
		return nil
	})
	waitConverged(t, d.seeds(), stream, 4, 30*time.Second)
}
