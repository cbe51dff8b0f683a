package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/catena-streams/catena/client"
)

// TestOneWayLinkCut walks SCENARIOS.md 23: r0 can no longer send to r1
// while the master, ingestion and r1 itself reach everyone. Every chain in
// which r0 sends to r1 is reordered, writes go on, and once the link heals
// every chain is whole again; no acknowledged record is lost, duplicated or
// out of order.
func TestOneWayLinkCut(t *testing.T) {
	const (
		producers  = 2
		keys       = 20
		window     = 200
		partitions = 4
	)
	cutter := newLinkCutter(t)
	d := startDev(t, t.TempDir())
	stream := d.state.Stream
	seeds := d.seeds()
	waitWhole(t, seeds, stream, partitions, 3, 30*time.Second)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	opts := client.ProducerOptions{RetryTimeout: 30 * time.Second}
	load := startKeyedLoad(ctx, d.client, stream, producers, keys, window, 0, opts, nil)
	eventually(t, 30*time.Second, func() error {
		if n := load.acks.Load(); n < 500 {
			return fmt.Errorf("%d acks before the cut", n)
		}
		return nil
	})

	from, to := d.replica("r0"), d.replica("r1")
	cv := newClusterView(t)
	sends := func() ([]uint32, error) {
		var through []uint32
		for p := range uint32(partitions) {
			v, err := cv.chain(seeds, stream, p)
			if err != nil {
				return nil, err
			}
			ids := make([]string, len(v.members))
			for i, m := range v.members {
				ids[i] = m.GetId()
			}
			if i := slices.Index(ids, from.ID); i >= 0 && i+1 < len(ids) && ids[i+1] == to.ID {
				through = append(through, p)
			}
		}
		return through, nil
	}
	through, err := sends()
	if err != nil || len(through) == 0 {
		t.Fatalf("no chain in which %s sends to %s (%v): nothing to cut", from.ID, to.ID, err)
	}

	cutter.cut(from.PID, to.Addr)
	cutAt := time.Now()
	eventually(t, 60*time.Second, func() error {
		if ps, err := sends(); err != nil || len(ps) > 0 {
			return fmt.Errorf("%s still sends to %s in partitions %v (%v)", from.ID, to.ID, ps, err)
		}
		return nil
	})
	reordered := time.Since(cutAt)
	acked := load.acks.Load()
	eventually(t, 30*time.Second, func() error {
		if n := load.acks.Load(); n < acked+500 {
			return fmt.Errorf("%d acks since the chains were reordered", n-acked)
		}
		return nil
	})
	t.Logf("link %s -> %s cut: partitions %v reordered %s after the cut, writes flowing again %s after it",
		from.ID, to.ID, through, reordered.Round(time.Millisecond), time.Since(cutAt).Round(time.Millisecond))

	cutter.heal()
	healedAt := time.Now()
	waitWhole(t, seeds, stream, partitions, 3, 60*time.Second)
	t.Logf("healed: every chain whole again %s later", time.Since(healedAt).Round(time.Millisecond))

	stop()
	all := load.wait()
	ackedAt, failed := ackedByOffset(t.Fatalf, all)
	got, ends := readAll(t, d.client, stream, partitions)
	checkStored(t.Errorf, all, ackedAt, got, ends, true)
	t.Logf("%d records acknowledged, %d failed or unresolved, all acknowledged ones read back once, in order", len(ackedAt), failed)
}
