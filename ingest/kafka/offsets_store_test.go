package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

func holdsOf(t *testing.T, c *cluster, consumer string) map[uint32]uint64 {
	t.Helper()
	resp, err := c.ing.ListConsumers(context.Background(), &catenapb.ListConsumersRequest{Stream: "s"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]uint64{}
	for _, p := range resp.GetPartitions() {
		for _, h := range p.GetHolds() {
			if h.GetConsumer() == consumer {
				out[p.GetPartition()] = h.GetOffset()
			}
		}
	}
	return out
}

// TestOffsetsCommitFailsWhenTheRecordIsNotStored: ingestion answers a
// produce whose records failed with a result error, not a call error; a
// commit whose offsets record was refused (here by a chain shorter than
// the stream's minimum) must fail, and move no hold.
func TestOffsetsCommitFailsWhenTheRecordIsNotStored(t *testing.T) {
	c := startCluster(t, 1)
	c.produceN(t, 1, 10)
	c.configure("short", &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, MinChainLength: 4})
	st := &groups.StreamOffsets{Ingest: c.ing, Stream: "short"}
	ctx := ctxT(t, 60*time.Second)
	errs, err := st.Commit(ctx, "g", []groups.Commit{{TopicPartition: groups.TopicPartition{Topic: "s", Partition: 0}, Committed: groups.Committed{Offset: 5}}})
	if err == nil {
		t.Fatalf("a commit whose record the chain refused succeeded (%v)", errs)
	}
	if h := holdsOf(t, c, groups.HoldName("g")); len(h) != 0 {
		t.Fatalf("a failed commit moved the holds: %v", h)
	}
}

// TestPipelinedCommitsOfOneConnectionApplyInOrder: a client may send
// several OffsetCommits on one connection without waiting (franz-go's and
// the Java client's async commits); the last one sent must be the one
// that stays, whatever order their goroutines run in.
func TestPipelinedCommitsOfOneConnectionApplyInOrder(t *testing.T) {
	c := startCluster(t, 1)
	c.produceN(t, 1, 100)
	conn, err := net.Dial("tcp", c.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const n = 40
	var out []byte
	for i := 1; i <= n; i++ {
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Version = 8
		req.Group, req.Generation = "pipelined", -1
		tp := kmsg.NewOffsetCommitRequestTopic()
		tp.Topic = "s"
		tp.Partitions = []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: int64(i), LeaderEpoch: -1}}
		req.Topics = []kmsg.OffsetCommitRequestTopic{tp}
		body := []byte{}
		body = binary.BigEndian.AppendUint16(body, uint16(req.Key()))
		body = binary.BigEndian.AppendUint16(body, uint16(req.Version))
		body = binary.BigEndian.AppendUint32(body, uint32(i))
		body = binary.BigEndian.AppendUint16(body, 1)
		body = append(body, 't', 0) // client id "t", no tagged fields
		body = req.AppendTo(body)
		out = binary.BigEndian.AppendUint32(out, uint32(len(body)))
		out = append(out, body...)
	}
	if _, err := conn.Write(out); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	for i := 1; i <= n; i++ {
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			t.Fatal(err)
		}
		resp := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(conn, resp); err != nil {
			t.Fatal(err)
		}
		if got := int(binary.BigEndian.Uint32(resp)); got != i {
			t.Fatalf("answer %d has correlation id %d", i, got)
		}
	}
	offs, err := c.groups.FetchOffsets(context.Background(), "pipelined", nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := offs[groups.TopicPartition{Topic: "s", Partition: 0}].Offset; o != n {
		t.Fatalf("after %d pipelined commits the group is at %d, want %d", n, o, n)
	}
}

// TestACoordinatorThatGainsAGroupReassertsItsHolds: a group's holds can be
// left behind its committed offsets (a hold move that failed, or a former
// coordinator's late move during a membership change) and a consumer that
// only commits what it committed before changes nothing, so nothing moved
// them again: retention kept more than the group needs for as long as the
// group lived. A coordinator that gains a group makes its holds equal its
// committed offsets.
func TestACoordinatorThatGainsAGroupReassertsItsHolds(t *testing.T) {
	c := startCluster(t, 2)
	c.produceN(t, 2, 100)
	ctx := ctxT(t, 60*time.Second)
	tp0, tp1 := groups.TopicPartition{Topic: "s", Partition: 0}, groups.TopicPartition{Topic: "s", Partition: 1}
	// The harness's coordinator commits the group's offsets and holds them.
	if _, err := c.groups.CommitOffsets(ctx, "inherited", "", -1, []groups.Commit{
		{TopicPartition: tp0, Committed: groups.Committed{Offset: 50, LeaderEpoch: -1}},
		{TopicPartition: tp1, Committed: groups.Committed{Offset: 40, LeaderEpoch: -1}},
	}); err != nil {
		t.Fatal(err)
	}
	hold := groups.HoldName("inherited")
	if h := holdsOf(t, c, hold); h[0] != 50 || h[1] != 40 {
		t.Fatalf("holds after the commit: %v, want 0:50 1:40", h)
	}
	// A former coordinator's late move leaves partition 0 behind.
	if _, err := c.ing.CommitConsumerOffset(ctx, &catenapb.CommitConsumerOffsetRequest{Stream: "s", Partition: 0, Consumer: hold, Offset: 20}); err != nil {
		t.Fatal(err)
	}
	// A new coordinator gains the group; its consumer commits what it
	// committed before (an idle auto-commit).
	next := groups.New(groups.Options{Offsets: &groups.StreamOffsets{Ingest: c.ing}, Logger: testr.New(t).WithName("next")})
	runCoordinator(t, next)
	if _, err := next.CommitOffsets(ctx, "inherited", "", -1, []groups.Commit{{TopicPartition: tp0, Committed: groups.Committed{Offset: 50, LeaderEpoch: -1}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the new coordinator to move the hold it inherited to the committed offset", func() bool {
		h := holdsOf(t, c, hold)
		return h[0] == 50 && h[1] == 40
	})
}

// TestACommitThatCannotBeHeldIsRefusedBeforeItIsStored: a replica keeps
// at most contract.MaxHoldsPerPartition holds per partition. A group's
// first commit on a partition that has no room for its hold was stored,
// then failed on the hold as COORDINATOR_NOT_AVAILABLE, which clients
// retry: each retry stored the offset again and failed again. It must be
// refused, with a reason and a code clients do not retry, and store
// nothing for that partition; the request's other partitions, and groups
// that hold the partition already, commit as ever.
func TestACommitThatCannotBeHeldIsRefusedBeforeItIsStored(t *testing.T) {
	c := startCluster(t, 2)
	c.produceN(t, 2, 10)
	ctx := ctxT(t, 120*time.Second)
	adm := kadm.NewClient(c.client())
	commit := func(group string, offs map[int32]int64) kadm.OffsetResponses {
		t.Helper()
		o := kadm.Offsets{}
		for p, at := range offs {
			o.Add(kadm.Offset{Topic: "s", Partition: p, At: at, LeaderEpoch: -1})
		}
		resp, err := adm.CommitOffsets(ctx, group, o)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if err := commit("early", map[int32]int64{1: 2}).Error(); err != nil {
		t.Fatal(err)
	}
	// Fill partition 1's holds.
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range contract.MaxHoldsPerPartition - 1 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := c.ing.CommitConsumerOffset(ctx, &catenapb.CommitConsumerOffsetRequest{Stream: "s", Partition: 1, Consumer: fmt.Sprintf("filler-%04d", i), Offset: 0}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	end := func() uint64 {
		resp, err := c.ing.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: groups.DefaultOffsetsStream, Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOffset()
	}
	before := end()
	resp := commit("late", map[int32]int64{0: 5, 1: 5})
	if r, _ := resp.Lookup("s", 0); r.Err != nil {
		t.Fatalf("partition 0, which has room, was refused: %v", r.Err)
	}
	r, _ := resp.Lookup("s", 1)
	if !errors.Is(r.Err, kerr.PolicyViolation) {
		t.Fatalf("partition 1, with no room for the group's hold, answered %v, want POLICY_VIOLATION", r.Err)
	}
	if after := end(); after != before+1 {
		t.Fatalf("the offsets stream went from %d to %d records, want one (partition 0's commit)", before, after)
	}
	fetched, err := adm.FetchOffsets(ctx, "late")
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := fetched.Lookup("s", 1); ok && o.At >= 0 {
		t.Fatalf("the refused commit is stored: %+v", o)
	}
	if o, _ := fetched.Lookup("s", 0); o.At != 5 {
		t.Fatalf("partition 0 committed at %d, want 5", o.At)
	}
	// A group holding partition 1 already needs no room, also on a
	// coordinator that has not moved its hold itself (one that took
	// the group over).
	fresh := &groups.StreamOffsets{Ingest: c.ing}
	errs, err := fresh.Commit(ctx, "early", []groups.Commit{{TopicPartition: groups.TopicPartition{Topic: "s", Partition: 1}, Committed: groups.Committed{Offset: 7, LeaderEpoch: -1}}})
	if err != nil || errs[0] != nil {
		t.Fatalf("a group that holds the partition could not commit on it: %v %v", err, errs)
	}
	if h := holdsOf(t, c, groups.HoldName("early")); h[1] != 7 {
		t.Fatalf("early's hold on partition 1 is at %d, want 7", h[1])
	}
}
