package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// earlyHead is a fake head that answers each append only when its offsets
// are assigned (the first of the two answers) and gives its final,
// committed answer only when the test releases it: what a head whose
// acknowledgements have not climbed back yet looks like.
type earlyHead struct {
	chainMember
	release chan struct{} // one final answer per receive
}

func (h *earlyHead) AppendStream(stream catenapb.Replica_AppendStreamServer) error {
	var finals []*catenapb.AppendResponse
	recv := make(chan *catenapb.AppendRequest)
	errc := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			recv <- req
		}
	}()
	for {
		select {
		case err := <-errc:
			return err
		case req := <-recv:
			final, err := h.assign(req)
			if err != nil {
				return err
			}
			if req.GetAnswerAssigned() {
				early := &catenapb.AppendResponse{RequestId: final.RequestId, Offsets: final.Offsets, Duplicate: final.Duplicate, Assigned: true, Epoch: final.Epoch}
				if err := stream.Send(early); err != nil {
					return err
				}
			}
			finals = append(finals, final)
		case <-h.release:
			if len(finals) == 0 {
				continue
			}
			if err := stream.Send(finals[0]); err != nil {
				return err
			}
			finals = finals[1:]
		}
	}
}

// completingTail is a fake tail whose completions the test sends.
type completingTail struct {
	chainMember
	completions chan *catenapb.Completion
}

func (t *completingTail) Completions(req *catenapb.CompletionsRequest, stream catenapb.Replica_CompletionsServer) error {
	for {
		select {
		case c := <-t.completions:
			if err := stream.Send(c); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// TestProducersAreAnsweredOnTheTailsCompletion: ingestion answers a
// producer as soon as the tail's completion of the epoch the head assigned
// the offsets under reaches them, without the head's final answer (which
// climbs back up the chain); a completion of another epoch, or short of the
// records, answers nothing; and the head's final answer still answers on
// its own when no completion comes.
func TestProducersAreAnsweredOnTheTailsCompletion(t *testing.T) {
	head := &earlyHead{chainMember: chainMember{id: "head"}, release: make(chan struct{}, 16)}
	tail := &completingTail{chainMember: chainMember{id: "tail"}, completions: make(chan *catenapb.Completion, 16)}
	addrs := []string{serveReplica(t, head), serveReplica(t, tail)}
	members := []*catenapb.Member{{Id: "head", Addr: addrs[0]}, {Id: "tail", Addr: addrs[1]}}
	head.view(3, members)
	tail.view(3, members)

	s := startIngestion(t, addrs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// pending says whether done stays open while the test waits a moment:
	// evidence of nothing, taken only where an answer would be a defect.
	pending := func(done <-chan error) bool {
		select {
		case err := <-done:
			t.Fatalf("answered (%v) before the records were complete", err)
			return false
		case <-time.After(200 * time.Millisecond):
			return true
		}
	}
	answered := func(what string, done <-chan error) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-ctx.Done():
			t.Fatalf("%s: never answered", what)
		}
	}

	first := produceAsync(ctx, s) // offset 0
	pending(first)
	tail.completions <- &catenapb.Completion{Epoch: 2, Committed: 5} // another epoch's
	pending(first)
	tail.completions <- &catenapb.Completion{Epoch: 3, Committed: 1}
	answered("the first record, on the tail's completion", first)

	second := produceAsync(ctx, s) // offset 1
	pending(second)
	tail.completions <- &catenapb.Completion{Epoch: 3, Committed: 1} // short of it
	pending(second)
	// No completion: the head's final answers (the first's, then the
	// second's) answer it.
	head.release <- struct{}{}
	pending(second)
	head.release <- struct{}{}
	answered("the second record, on the head's final answer", second)
}

// TestProducesWithoutProducerIDDoNotWaitForEachOther: ingestion numbers
// the records of producers without an id itself, under one lock so that
// each partition receives them in order. That lock once stayed held until
// the records committed, so one such produce waited for the one before
// it, here for ever behind a partition whose head never answers; it is let
// go once the records are queued.
func TestProducesWithoutProducerIDDoNotWaitForEachOther(t *testing.T) {
	head := &chainMember{id: "head", partitions: 2}
	head.hungPartition.Store(0 + 1)
	addr := serveReplica(t, head)
	head.view(1, []*catenapb.Member{{Id: "head", Addr: addr}})
	s := startIngestion(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stuck := make(chan error, 1)
	go func() {
		p := uint32(0)
		_, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Value: []byte("to the hung partition"), Partition: &p}}})
		stuck <- err
	}()
	// Wait until the first produce's record is queued at partition 0 (its
	// appender exists): it now waits for an answer that never comes.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s.appendersMu.Lock()
		queued := s.appenders[appenderKey{"s", 0}] != nil
		s.appendersMu.Unlock()
		if queued {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the produce to partition 0 was never queued")
		}
	}
	p := uint32(1)
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	resp, err := s.Produce(pctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Value: []byte("to the other"), Partition: &p}}})
	if err != nil {
		t.Fatalf("a produce to partition 1 waited for one to the hung partition 0: %v", err)
	}
	if r := resp.GetResults()[0]; r.GetErrorCode() != 0 || r.GetPartition() != 1 {
		t.Fatalf("produce to partition 1 answered %+v", r)
	}
	select {
	case err := <-stuck:
		t.Fatalf("the produce to the hung partition was answered: %v", err)
	default:
	}
}
