package integration

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/catena-streams/catena/client"
)

// TestKillNineAllAndRestart checks "an acknowledged record is never lost
// while a member that stored it survives with its volume, and is never
// returned twice" across a crash of the whole cluster (every replica
// and the dev process SIGKILLed mid-load, SCENARIOS.md 8 and 16 at their
// extreme): after a restart on the same data directory every acked record
// is at its acked offset with its key and value, nothing is stored twice,
// offsets are dense, chain members agree (checksums), and new records are
// appended after the old ones. A SIGKILL keeps what the processes wrote in
// the page cache.
func TestKillNineAllAndRestart(t *testing.T) {
	crashAllAndRestart(t, catenaBin, (*devCluster).kill9All)
}

// TestPowerLossOfEveryMember is the same crash as a coordinated power cut
// (SCENARIOS.md 21): the replicas run on lazyfs, so what each had not
// fsynced is gone when it is killed, and the members of a chain come back
// with logs of different lengths, a successor possibly holding more than
// its predecessor.
func TestPowerLossOfEveryMember(t *testing.T) {
	crashAllAndRestart(t, catenaPowerLossBin, (*devCluster).kill9All)
}

// TestPowerLossInTurn cuts the master first, then each replica in turn
// with a pause between them, so that the members still running sync what
// their dead predecessor had not: successors come back holding more than
// their predecessors, at the epoch the master last installed.
func TestPowerLossInTurn(t *testing.T) {
	crashAllAndRestart(t, catenaPowerLossBin, killInTurn)
}

// killInTurn kills the master, then each replica with a pause between.
func killInTurn(d *devCluster) {
	d.proc.kill9()
	for _, r := range d.state.Replicas {
		_ = syscall.Kill(r.PID, syscall.SIGKILL)
		eventually(d.t, 10*time.Second, func() error {
			if pidGone(r.PID) {
				return nil
			}
			return fmt.Errorf("replica %s (pid %d) survived SIGKILL", r.ID, r.PID)
		})
		time.Sleep(100 * time.Millisecond) // the fault: the others sync meanwhile
	}
}

// The same three crashes with every replica keeping a journal
// (docs/journal.md): acknowledged records are durable in the journal's
// groups, not in the partitions' files, which recovery cuts at the last
// checkpoint and writes again from the journal.
func TestKillNineAllAndRestartWithJournal(t *testing.T) {
	crashAllAndRestart(t, catenaBin, (*devCluster).kill9All, "--journal")
}

func TestPowerLossOfEveryMemberWithJournal(t *testing.T) {
	crashAllAndRestart(t, catenaPowerLossBin, (*devCluster).kill9All, "--journal")
}

func TestPowerLossInTurnWithJournal(t *testing.T) {
	crashAllAndRestart(t, catenaPowerLossBin, killInTurn, "--journal")
}

func crashAllAndRestart(t *testing.T, bin string, crash func(*devCluster), devArgs ...string) {
	const (
		producers      = 3
		keys           = 30
		killAfter      = 4000 // acks received in all before the kill
		window         = 1500 // unresolved futures per producer
		partitions     = 4
		maxPerProducer = 20000
	)
	dataDir := t.TempDir()
	d := startDevOf(t, bin, dataDir, devArgs...)
	stream := d.state.Stream

	var (
		killed   = make(chan struct{})
		killOnce sync.Once
	)
	sendCtx, stopSending := context.WithCancel(context.Background())
	defer stopSending()
	// Short retry bounds: after the kill, unacknowledged records must fail
	// quickly rather than retry for 30s.
	opts := client.ProducerOptions{RetryTimeout: 2 * time.Second, RequestTimeout: 2 * time.Second}
	load := startKeyedLoad(sendCtx, d.client, stream, producers, keys, window, maxPerProducer, opts, func(n int64) {
		if n >= killAfter {
			killOnce.Do(func() { close(killed) })
		}
	})

	select {
	case <-killed:
	case <-time.After(60 * time.Second):
		t.Fatalf("only %d acks after 60s", load.acks.Load())
	}
	crash(d)
	stopSending()
	all := load.wait()
	acked, failed := ackedByOffset(t.Fatalf, all)
	t.Logf("before the kill: %d records acked, %d failed or unresolved", len(acked), failed)
	if len(acked) < killAfter {
		t.Fatalf("only %d acked records", len(acked))
	}

	// Restart on the same data directory.
	d2 := startDevOf(t, bin, dataDir, devArgs...)
	waitWhole(t, d2.seeds(), stream, partitions, 3, 60*time.Second)
	got, ends := readAll(t, d2.client, stream, partitions)
	// Unacked records may have been stored (their acks were lost), but
	// never twice, and nothing that was not sent.
	checkStored(t.Errorf, all, acked, got, ends, false)

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
