package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/internal/devcluster"
)

// TestKilledReplicaIsRepairedAndRejoins: catena dev is its chains' master.
// Replicas are SIGKILLed one after another while producers run: dev installs chains
// without it at once (writes go on), restarts it on its volume, truncates
// what the chains never committed and re-adds it at the tail. Afterwards
// every acknowledged record is present exactly once at its acked offset,
// each producer's records are in order, and every chain is back to full
// length with members' checksums agreeing.
func TestKilledReplicaIsRepairedAndRejoins(t *testing.T) {
	const (
		producers    = 2
		keys         = 20
		partitions   = 4
		beforeKill   = 3000 // acks before the kill
		afterKill    = 3000 // acks after the kill before producers stop
		window       = 400
		rejoinWithin = 90 * time.Second
	)
	dataDir := t.TempDir()
	d := startDev(t, dataDir)
	stream := d.state.Stream
	// One at a time, then two at once (SCENARIOS.md 11: the survivor is
	// the whole chain until the others return).
	rounds := [][]string{{"r0"}, {"r2"}, {"r0", "r1"}}

	var (
		reachedPre = make(chan struct{})
		preOnce    sync.Once
	)
	sendCtx, stopSending := context.WithCancel(context.Background())
	defer stopSending()
	opts := client.ProducerOptions{RetryTimeout: 60 * time.Second, RequestTimeout: 5 * time.Second}
	load := startKeyedLoad(sendCtx, d.client, stream, producers, keys, window, 0, opts, func(n int64) {
		if n >= beforeKill {
			preOnce.Do(func() { close(reachedPre) })
		}
	})
	ackCount := &load.acks

	select {
	case <-reachedPre:
	case <-time.After(60 * time.Second):
		t.Fatalf("only %d acks after 60s", ackCount.Load())
	}
	// Kill, wait for writes to go on and for the victims to rejoin every
	// chain (under load), then the next round.
	for _, victims := range rounds {
		oldPIDs := map[string]int{}
		for _, v := range victims {
			oldPIDs[v] = d.replica(v).PID
		}
		atKill := max(ackCount.Load(), 1)
		for _, v := range victims {
			if err := syscall.Kill(oldPIDs[v], syscall.SIGKILL); err != nil {
				t.Fatalf("kill %s (pid %d): %v", v, oldPIDs[v], err)
			}
		}
		t.Logf("killed %v (pids %v) after %d acks", victims, oldPIDs, atKill)
		eventually(t, 60*time.Second, func() error {
			if n := ackCount.Load(); n < atKill+afterKill {
				return fmt.Errorf("writes did not go on after the kill: %d acks, %d at the kill", n, atKill)
			}
			return nil
		})
		// The replicas are back (new processes on the same volumes and addresses).
		eventually(t, rejoinWithin, func() error {
			b, err := os.ReadFile(filepath.Join(dataDir, devcluster.StateFile))
			if err != nil {
				return err
			}
			var st devcluster.State
			if err := json.Unmarshal(b, &st); err != nil {
				return err
			}
			for _, r := range st.Replicas {
				if old, ok := oldPIDs[r.ID]; ok && (r.PID == old || r.PID == 0) {
					return fmt.Errorf("%s not restarted yet", r.ID)
				}
			}
			d.state = st // so cleanup stops the new processes
			return nil
		})
		// Every chain is back to full length with the victims in it and
		// every member at the chain's epoch.
		eventually(t, rejoinWithin, func() error {
			cv := newClusterView(t)
			for p := range partitions {
				v, err := cv.chain(d.seeds(), stream, uint32(p))
				if err != nil {
					return err
				}
				if len(v.members) != 3 {
					return fmt.Errorf("partition %d not regrown: %v", p, v)
				}
				for _, r := range v.reports {
					if r.GetEpoch() != v.epoch || r.GetError() != "" {
						return fmt.Errorf("partition %d: member %s not at epoch %d: %v", p, r.GetReplicaId(), v.epoch, v)
					}
				}
			}
			return nil
		})
		t.Logf("%v rejoined every chain", victims)
	}
	stopSending()
	all := load.wait()

	views := waitConverged(t, d.seeds(), stream, partitions, 30*time.Second)
	for _, v := range views {
		if v.epoch < 2 {
			t.Errorf("partition %d still at epoch %d: the chain was never reconfigured", v.partition, v.epoch)
		}
	}

	acked, failed := ackedByOffset(t.Fatalf, all)
	t.Logf("%d records acked, %d failed or unresolved", len(acked), failed)
	got, ends := readAll(t, d.client, stream, partitions)
	checkStored(t.Errorf, all, acked, got, ends, true)
	out, _ := os.ReadFile(d.outPath)
	if !bytes.Contains(out, []byte("Reordering chain")) {
		t.Errorf("catena dev never logged a chain reordering")
	}
	for _, line := range bytes.Split(out, []byte("\n")) {
		for _, w := range []string{"Reordering chain", "Truncated", "Restarted replica", "agrees with the chain", "exited"} {
			if bytes.Contains(line, []byte(w)) {
				t.Logf("dev: %s", line)
				break
			}
		}
	}
}
