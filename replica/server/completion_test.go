package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// TestTheTailCompletesBeforeTheHeadAnswers: a head asked for it answers an
// append as soon as its offsets are assigned, and the tail's Completions of
// that epoch reach them once every member holds them durably; the head's
// final answer follows. A Completions stream for another epoch is refused.
func TestTheTailCompletesBeforeTheHeadAnswers(t *testing.T) {
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	configure(t, 1, a, b, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	completions, err := client(t, c.addr).Completions(ctx, &catenapb.CompletionsRequest{Stream: "s", Partition: 0, Epoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := completions.Recv(); err != nil || first.GetEpoch() != 1 || first.GetCommitted() != 0 {
		t.Fatalf("first completion %v, %v: want epoch 1 at 0, at once", first, err)
	}

	stream, err := client(t, a.addr).AppendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&catenapb.AppendRequest{Stream: "s", Partition: 0, Epoch: 1, RequestId: 7, Records: records(42, 1, 3), AnswerAssigned: true}); err != nil {
		t.Fatal(err)
	}
	early, err := stream.Recv()
	if err != nil || !early.GetAssigned() || early.GetRequestId() != 7 || early.GetEpoch() != 1 || len(early.GetOffsets()) != 3 || early.GetOffsets()[2] != 2 {
		t.Fatalf("early answer %v, %v", early, err)
	}
	for {
		c, err := completions.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if c.GetCommitted() >= 3 {
			break
		}
	}
	final, err := stream.Recv()
	if err != nil || final.GetAssigned() || final.GetRequestId() != 7 || final.GetCommitted() < 3 || final.GetEpoch() != 1 {
		t.Fatalf("final answer %v, %v", final, err)
	}

	other, err := client(t, c.addr).Completions(ctx, &catenapb.CompletionsRequest{Stream: "s", Partition: 0, Epoch: 2})
	if err == nil {
		_, err = other.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("completions of another epoch: %v, want FailedPrecondition", err)
	}
}

// TestAHeadStoppingAnswersWhatWaits: a head whose chain cannot commit (its
// successor is gone) answers the append waiting for its commit with
// Unavailable when it stops, rather than spinning on the stop.
func TestAHeadStoppingAnswersWhatWaits(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	b.g.Stop()
	b.srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := client(t, a.addr).AppendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&catenapb.AppendRequest{Stream: "s", Partition: 0, Epoch: 1, RequestId: 1, Records: records(42, 1, 1), AnswerAssigned: true}); err != nil {
		t.Fatal(err)
	}
	if early, err := stream.Recv(); err != nil || !early.GetAssigned() {
		t.Fatalf("early answer %v, %v", early, err)
	}
	a.srv.Close() // the gRPC server still serves the stream
	final, err := stream.Recv()
	if err != nil || codes.Code(final.GetErrorCode()) != codes.Unavailable {
		t.Fatalf("answer after the stop: %v, %v; want Unavailable", final, err)
	}
}

// TestACutLogAnswersNoWaitingAppend: an append waits for its commit with
// the count of the log's cuts at the time it was made; once the log has
// been cut since (a deposed head truncated and copied again, outside the
// chain), a committed offset past the append no longer says its records
// are the ones at those offsets, and the append is refused for a retry
// (which de-duplication answers with the records' real offsets).
func TestACutLogAnswersNoWaitingAppend(t *testing.T) {
	a := startNode(t, "a", nil)
	configure(t, 1, a)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Partition: 0, Epoch: 1, Records: records(42, 1, 2)}); err != nil {
		t.Fatal(err)
	}
	p, err := a.srv.lookup("s", 0)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.truncations.Load()
	if done, _, err := p.commitState(1, 2, now); !done || err != nil {
		t.Fatalf("an append of this log, committed: done %v, %v", done, err)
	}
	p.truncations.Add(1) // what a truncation or a reset does
	if done, _, err := p.commitState(1, 2, now); done || status.Code(err) != codes.Unavailable {
		t.Fatalf("an append of the log before the cut: done %v, %v; want Unavailable", done, err)
	}
}
