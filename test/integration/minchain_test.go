package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/catena-streams/catena/client"
)

// TestMinChainLengthRefusesWrites: with --min-chain-length 3, a member
// paused past the failure timeout is removed from every chain, and the
// heads of the shortened chains refuse writes with an error naming the
// shortfall instead of acknowledging records held by two members. Once it
// resumes and rejoins, writes go on and every chain converges.
func TestMinChainLengthRefusesWrites(t *testing.T) {
	const partitions = 4
	d := startDev(t, t.TempDir(), "--min-chain-length", "3", "--failure-timeout", "1s")
	stream := d.state.Stream
	send := func(opts client.ProducerOptions, val string) error {
		prod := client.NewProducer(d.client, stream, opts)
		defer prod.Close()
		_, err := prod.Send(context.Background(), client.Record{Key: []byte("k"), Value: []byte(val)}).Wait()
		return err
	}
	patient := client.ProducerOptions{RetryTimeout: 60 * time.Second, RequestTimeout: 3 * time.Second, MaxRetryBackoff: 100 * time.Millisecond}
	if err := send(patient, "before"); err != nil {
		t.Fatalf("write to a healthy cluster: %v", err)
	}

	victim := d.replica("r1")
	if err := syscall.Kill(victim.PID, syscall.SIGSTOP); err != nil {
		t.Fatalf("pause r1 (pid %d): %v", victim.PID, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(victim.PID, syscall.SIGCONT)
		}
	}
	defer resume()
	var others []string
	for _, r := range d.state.Replicas {
		if r.ID != victim.ID {
			others = append(others, r.Addr)
		}
	}
	cv := newClusterView(t)
	eventually(t, 30*time.Second, func() error {
		for p := range partitions {
			v, err := cv.chain(others, stream, uint32(p))
			if err != nil {
				return err
			}
			if len(v.members) != 2 {
				return fmt.Errorf("partition %d not shortened yet: %v", p, v)
			}
		}
		return nil
	})
	err := send(client.ProducerOptions{RetryTimeout: 2 * time.Second, RequestTimeout: time.Second, MaxRetryBackoff: 100 * time.Millisecond}, "refused")
	if err == nil {
		t.Fatalf("a write to a chain of 2 with --min-chain-length 3 was acknowledged")
	}
	if !strings.Contains(err.Error(), "has 2 of the 3 members required for writes") {
		t.Fatalf("refused write: %v; want an error naming the shortfall (2 of the 3 members required)", err)
	}
	t.Logf("refused as expected: %v", err)

	resume()
	if err := send(patient, "after"); err != nil {
		t.Fatalf("write after the member resumed: %v", err)
	}
	views := waitConverged(t, d.seeds(), stream, partitions, 60*time.Second)
	for _, v := range views {
		if len(v.members) != 3 {
			t.Errorf("partition %d ended with %d members: %v", v.partition, len(v.members), v)
		}
	}
}
