package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// TestBadInput checks "bad input (malformed requests, oversized records,
// invalid specs) gets a clear error and changes nothing that was stored",
// "a node never accepts a message from an older epoch" (DESIGN.md) and
// SCENARIOS.md 8 (torn last batch) and 9 (corrupted sealed segment). Each
// case asserts the gRPC code and that every member's epoch, membership,
// log end and rolling checksum of the affected partition are unchanged.
func TestBadInput(t *testing.T) {
	d := startDev(t, t.TempDir())
	demo := d.state.Stream
	seeds := d.seeds()
	cv := newClusterView(t)
	ingest := d.client.Ingest()

	// A stream of our own on the dev replicas, at epoch 3, so that older
	// epochs exist to be refused. Tail first, as a chain master does.
	const bad, epoch = "badin", uint64(3)
	members := make([]*catenapb.Member, 0, 3)
	rcs := map[string]catenapb.ReplicaClient{}
	for _, r := range d.state.Replicas {
		members = append(members, &catenapb.Member{Id: r.ID, Addr: r.Addr})
		rcs[r.ID] = replicaClient(t, r.Addr)
	}
	cfg := &catenapb.StreamConfig{Partitions: 1}
	configure := func(epoch uint64, ms []*catenapb.Member) *catenapb.ConfigureRequest {
		return &catenapb.ConfigureRequest{Stream: bad, Partition: 0, Epoch: epoch, Members: ms, Config: cfg}
	}
	for i := len(members) - 1; i >= 0; i-- {
		if _, err := rcs[members[i].GetId()].Configure(ctxT(t, 10*time.Second), configure(epoch, members)); err != nil {
			t.Fatalf("configure %s on %s: %v", bad, members[i].GetId(), err)
		}
	}
	headRC, middleRC := rcs[members[0].GetId()], rcs[members[1].GetId()]
	appendReq := func(epoch uint64, n int) *catenapb.AppendRequest {
		req := &catenapb.AppendRequest{Stream: bad, Partition: 0, Epoch: epoch}
		for i := range n {
			req.Records = append(req.Records, &catenapb.AppendRecord{Key: []byte("k"), Value: []byte(fmt.Sprint("v", i))})
		}
		return req
	}
	eventually(t, 20*time.Second, func() error {
		_, err := headRC.Append(ctxT(t, 10*time.Second), appendReq(epoch, 10))
		return err
	})
	// Produce a little into demo too, so its partitions are not empty.
	for p := range uint32(4) {
		if _, err := ingest.Produce(ctxT(t, 30*time.Second), &catenapb.ProduceRequest{Stream: demo, Records: []*catenapb.ProduceRecord{{Key: []byte("x"), Value: []byte("y"), Partition: proto.Uint32(p)}}}); err != nil {
			t.Fatalf("produce to demo/%d: %v", p, err)
		}
	}

	// unchanged runs fn and checks that partition p of stream is the same
	// on every member before and after.
	unchanged := func(t *testing.T, stream string, p uint32, fn func()) {
		t.Helper()
		before := takeSnapshot(t, cv, seeds, stream, p)
		fn()
		before.mustEqual(t, takeSnapshot(t, cv, seeds, stream, p), t.Name())
	}

	t.Run("OversizedRecord", func(t *testing.T) {
		const part = 1
		unchanged(t, demo, part, func() {
			req := &catenapb.ProduceRequest{Stream: demo, ProducerId: 7, Records: []*catenapb.ProduceRecord{
				{Key: []byte("ok"), Value: []byte("small, valid, in the same request"), Sequence: 1, Partition: proto.Uint32(part)},
				{Key: []byte("big"), Value: bytes.Repeat([]byte{'v'}, 1<<20-2), Sequence: 2, Partition: proto.Uint32(part)},
			}}
			_, err := ingest.Produce(ctxT(t, 30*time.Second), req)
			st := wantCode(t, err, codes.InvalidArgument, "produce of a record of 1 MiB + 1 byte")
			if !strings.Contains(st.Message(), "limit") || !strings.Contains(st.Message(), "1048576") {
				t.Errorf("error %q does not name the 1048576-byte limit", st.Message())
			}
		})
		// Exactly the limit is fine (the boundary is key plus value).
		_, err := ingest.Produce(ctxT(t, 30*time.Second), &catenapb.ProduceRequest{Stream: demo, Records: []*catenapb.ProduceRecord{
			{Key: []byte("big"), Value: bytes.Repeat([]byte{'v'}, 1<<20-3), Partition: proto.Uint32(part)},
		}})
		if err != nil {
			t.Errorf("produce of a record of exactly 1 MiB: %v", err)
		}
	})

	t.Run("UnknownStream", func(t *testing.T) {
		_, err := ingest.Produce(ctxT(t, 10*time.Second), &catenapb.ProduceRequest{Stream: "no-such-stream", Records: []*catenapb.ProduceRecord{{Key: []byte("k"), Value: []byte("v")}}})
		wantCode(t, err, codes.NotFound, "produce to an unknown stream")
		_, err = d.client.Fetch(ctxT(t, 10*time.Second), "no-such-stream", 0, 0, 0, 0)
		wantCode(t, err, codes.NotFound, "fetch from an unknown stream")
		streams, err := d.client.ListStreams(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range streams {
			if s == "no-such-stream" {
				t.Errorf("an unknown stream appeared after a produce to it: %v", streams)
			}
		}
	})

	t.Run("PartitionOutOfRange", func(t *testing.T) {
		for p := range uint32(4) {
			before := takeSnapshot(t, cv, seeds, demo, p)
			defer func() {
				before.mustEqual(t, takeSnapshot(t, cv, seeds, demo, p), fmt.Sprintf("%s (partition %d)", t.Name(), p))
			}()
		}
		_, err := ingest.Produce(ctxT(t, 10*time.Second), &catenapb.ProduceRequest{Stream: demo, Records: []*catenapb.ProduceRecord{
			{Key: []byte("k"), Value: []byte("valid"), Partition: proto.Uint32(0)},
			{Key: []byte("k"), Value: []byte("v"), Partition: proto.Uint32(4)},
		}})
		wantCode(t, err, codes.InvalidArgument, "produce to partition 4 of 4")
		_, err = d.client.Fetch(ctxT(t, 10*time.Second), demo, 4, 0, 0, 0)
		wantCode(t, err, codes.InvalidArgument, "fetch from partition 4 of 4")
	})

	t.Run("ConfigureStaleEpoch", func(t *testing.T) {
		unchanged(t, bad, 0, func() {
			for _, m := range members {
				_, err := rcs[m.GetId()].Configure(ctxT(t, 10*time.Second), configure(epoch-1, members))
				wantCode(t, err, codes.FailedPrecondition, "configure at an older epoch on "+m.GetId())
			}
		})
	})

	t.Run("ConfigureSameEpochOtherMembers", func(t *testing.T) {
		reordered := []*catenapb.Member{members[0], members[2], members[1]}
		unchanged(t, bad, 0, func() {
			for _, ms := range [][]*catenapb.Member{reordered, members[:2]} {
				for _, m := range members {
					_, err := rcs[m.GetId()].Configure(ctxT(t, 10*time.Second), configure(epoch, ms))
					wantCode(t, err, codes.FailedPrecondition, "configure at the same epoch with other members on "+m.GetId())
				}
			}
		})
	})

	t.Run("ConfigureInvalid", func(t *testing.T) {
		cases := map[string]*catenapb.ConfigureRequest{
			"zero members":            configure(epoch+1, nil),
			"duplicate member":        configure(epoch+1, []*catenapb.Member{members[0], members[1], members[0]}),
			"epoch 0":                 configure(0, members),
			"bad stream name":         {Stream: "Bad_Stream!", Partition: 0, Epoch: 1, Members: members, Config: cfg},
			"no config":               {Stream: bad, Partition: 0, Epoch: epoch + 1, Members: members},
			"partition beyond config": {Stream: bad, Partition: 1, Epoch: epoch + 1, Members: members, Config: cfg},
			"segment below 1 MiB":     {Stream: bad, Partition: 0, Epoch: epoch + 1, Members: members, Config: &catenapb.StreamConfig{Partitions: 1, SegmentBytes: 4096}},
			"segment above 1 GiB":     {Stream: bad, Partition: 0, Epoch: epoch + 1, Members: members, Config: &catenapb.StreamConfig{Partitions: 1, SegmentBytes: 1<<30 + 1}},
		}
		unchanged(t, bad, 0, func() {
			for name, req := range cases {
				for _, m := range members {
					_, err := rcs[m.GetId()].Configure(ctxT(t, 10*time.Second), req)
					wantCode(t, err, codes.InvalidArgument, fmt.Sprintf("configure with %s on %s", name, m.GetId()))
				}
			}
		})
		resp, err := headRC.Status(ctxT(t, 5*time.Second), &catenapb.StatusRequest{Stream: "Bad_Stream!"})
		if err != nil || len(resp.GetPartitions()) != 0 {
			t.Errorf("an invalid stream name was created: %v %v", resp, err)
		}
	})

	t.Run("AppendToNonHead", func(t *testing.T) {
		unchanged(t, bad, 0, func() {
			for _, rc := range []catenapb.ReplicaClient{middleRC, rcs[members[2].GetId()]} {
				_, err := rc.Append(ctxT(t, 10*time.Second), appendReq(epoch, 3))
				wantCode(t, err, codes.FailedPrecondition, "append to a non-head member")
			}
		})
	})

	t.Run("AppendStaleEpoch", func(t *testing.T) {
		unchanged(t, bad, 0, func() {
			_, err := headRC.Append(ctxT(t, 10*time.Second), appendReq(epoch-1, 3))
			wantCode(t, err, codes.FailedPrecondition, "append at an older epoch")
		})
	})

	t.Run("ReplicateGarbageFrame", func(t *testing.T) {
		unchanged(t, bad, 0, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			link, err := middleRC.Replicate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hdr := func() *catenapb.ReplicateFrame {
				return &catenapb.ReplicateFrame{Epoch: epoch, Stream: bad, Partition: 0, From: members[0].GetId()}
			}
			hello := hdr()
			hello.Body = &catenapb.ReplicateFrame_Hello{Hello: &catenapb.LinkHello{}}
			if err := link.Send(hello); err != nil {
				t.Fatal(err)
			}
			first, err := link.Recv()
			if err != nil {
				t.Fatalf("hello from the real predecessor at the current epoch refused: %v", err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			garbage := make([]byte, 300)
			for i := range garbage {
				garbage[i] = byte(rng.UintN(256))
			}
			data := hdr()
			data.Body = &catenapb.ReplicateFrame_Data{Data: &catenapb.BatchData{Frames: [][]byte{garbage}, Committed: first.GetLogEnd() + 1}}
			if err := link.Send(data); err != nil {
				t.Fatal(err)
			}
			for {
				if _, err = link.Recv(); err != nil {
					break
				}
			}
			st := wantCode(t, err, codes.InvalidArgument, "replicate a garbage frame")
			if !strings.Contains(st.Message(), "malformed") {
				t.Errorf("garbage frame refused with %q, want a malformed-frame error", st.Message())
			}
		})
	})

	t.Run("ReplicateStaleEpochHello", func(t *testing.T) {
		unchanged(t, bad, 0, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			link, err := middleRC.Replicate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hello := &catenapb.ReplicateFrame{Epoch: epoch - 1, Stream: bad, Partition: 0, From: members[0].GetId(),
				Body: &catenapb.ReplicateFrame_Hello{Hello: &catenapb.LinkHello{}}}
			if err := link.Send(hello); err != nil {
				t.Fatal(err)
			}
			_, err = link.Recv()
			wantCode(t, err, codes.FailedPrecondition, "replicate hello at an older epoch")
		})
	})

	t.Run("CorruptSealedSegmentAndTornTail", func(t *testing.T) {
		testCorruptSegments(t)
	})
}

// testCorruptSegments runs three standalone replicas with one chain of
// small segments: a member whose sealed segment has a flipped byte refuses
// to serve the partition and says why (SCENARIOS.md 9); a member whose last
// segment has a torn tail recovers to what it had (SCENARIOS.md 8).
func testCorruptSegments(t *testing.T) {
	const stream = "corrupt"
	base := t.TempDir()
	ids := []string{"ra", "rb", "rc"}
	reps := map[string]*replicaProc{}
	rcs := map[string]catenapb.ReplicaClient{}
	var members []*catenapb.Member
	var seeds []string
	for _, id := range ids {
		addr := freeAddr(t)
		reps[id] = startReplica(t, id, addr, filepath.Join(base, id))
		rcs[id] = replicaClient(t, addr)
		members = append(members, &catenapb.Member{Id: id, Addr: addr})
		seeds = append(seeds, addr)
	}
	cfg := &catenapb.StreamConfig{Partitions: 1, SegmentBytes: 1 << 20}
	for i := len(ids) - 1; i >= 0; i-- {
		if _, err := rcs[ids[i]].Configure(ctxT(t, 10*time.Second), &catenapb.ConfigureRequest{Stream: stream, Partition: 0, Epoch: 1, Members: members, Config: cfg}); err != nil {
			t.Fatalf("configure on %s: %v", ids[i], err)
		}
	}
	// About 5 MiB in batches of 8 x 60 KiB: two batches per 1 MiB segment.
	rng := rand.New(rand.NewPCG(3, 4))
	const appends, perAppend = 11, 8
	for a := range appends {
		req := &catenapb.AppendRequest{Stream: stream, Partition: 0, Epoch: 1}
		for i := range perAppend {
			v := make([]byte, 60<<10)
			for j := range v {
				v[j] = byte(rng.UintN(256))
			}
			req.Records = append(req.Records, &catenapb.AppendRecord{Key: []byte(fmt.Sprintf("k%d-%d", a, i)), Value: v})
		}
		err := poll(20*time.Second, func() error {
			_, err := rcs["ra"].Append(ctxT(t, 20*time.Second), req)
			return err
		})
		if err != nil {
			t.Fatalf("append %d: %v", a, err)
		}
	}
	views := waitConverged(t, seeds, stream, 1, 30*time.Second)
	want := views[0].reports[0]
	if want.GetLogEnd() != appends*perAppend {
		t.Fatalf("log end %d, want %d", want.GetLogEnd(), appends*perAppend)
	}
	partDir := func(id string) string { return filepath.Join(base, id, "streams", stream, "00000") }
	segs := func(id string) []string {
		m, err := filepath.Glob(filepath.Join(partDir(id), "*.seg"))
		if err != nil || len(m) < 3 {
			t.Fatalf("%s: segments %v (%v), want at least 3", id, m, err)
		}
		return m // lexical order is offset order
	}
	same := func(id string) {
		t.Helper()
		st, err := partStatus(ctxT(t, 5*time.Second), rcs[id], stream, 0)
		if err != nil {
			t.Fatalf("status of %s: %v", id, err)
		}
		if st.GetError() != "" || st.GetLogEnd() != want.GetLogEnd() || st.GetChecksum() != want.GetChecksum() {
			t.Errorf("%s changed: error %q log_end %d checksum %08x, want log_end %d checksum %08x", id, st.GetError(), st.GetLogEnd(), st.GetChecksum(), want.GetLogEnd(), want.GetChecksum())
		}
	}

	// Flip a byte inside the first batch of rc's first (sealed) segment.
	victim := "rc"
	reps[victim].proc.stop(10 * time.Second)
	first := segs(victim)[0]
	b, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	pos := 24 + 52 + 1000 // segment header, batch header, into the records
	b[pos] ^= 0x40
	if err := os.WriteFile(first, b, 0o644); err != nil {
		t.Fatal(err)
	}
	reps[victim] = startReplica(t, victim, members[2].GetAddr(), filepath.Join(base, victim))
	st, err := partStatus(ctxT(t, 5*time.Second), rcs[victim], stream, 0)
	if err != nil {
		t.Fatalf("status of the corrupt member: %v", err)
	}
	if !strings.Contains(strings.ToLower(st.GetError()), "corrupt") {
		t.Errorf("corrupt member reports error %q, want one mentioning corruption", st.GetError())
	}
	_, err = rcs[victim].Read(ctxT(t, 5*time.Second), &catenapb.FetchRequest{Stream: stream, Partition: 0, Offset: 0})
	wantCode(t, err, codes.DataLoss, "read from the corrupt member")
	same("ra")
	same("rb")

	// Torn tail: garbage after the last frame of rb's last segment.
	torn := "rb"
	reps[torn].proc.stop(10 * time.Second)
	ss := segs(torn)
	last := ss[len(ss)-1]
	f, err := os.OpenFile(last, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	garbage := make([]byte, 777)
	for i := range garbage {
		garbage[i] = byte(rng.UintN(256))
	}
	if _, err := f.Write(garbage); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	reps[torn] = startReplica(t, torn, members[1].GetAddr(), filepath.Join(base, torn))
	same(torn)
	same("ra")
	if ev, _ := filepath.Glob(last + ".torn-*"); len(ev) != 1 {
		t.Errorf("torn-tail evidence files %v, want one %s.torn-*", ev, filepath.Base(last))
	} else if eb, err := os.ReadFile(ev[0]); err != nil || !bytes.Equal(eb, garbage) {
		t.Errorf("torn-tail evidence %s does not hold the cut bytes (%v)", ev[0], err)
	}
	// Reopened from its volume, it waits for its master's new epoch before
	// it takes part in the chain again; the test is the master here, and
	// installs the chain without the corrupt member. Once its predecessor's
	// commit notice arrives, it serves its log again.
	if st, err := partStatus(ctxT(t, 5*time.Second), rcs[torn], stream, 0); err != nil || !st.GetRestored() {
		t.Fatalf("the member with the torn tail does not report it was reopened from its volume: %v %v", st, err)
	}
	for _, id := range []string{"rb", "ra"} {
		if _, err := rcs[id].Configure(ctxT(t, 10*time.Second), &catenapb.ConfigureRequest{Stream: stream, Partition: 0, Epoch: 2, Members: members[:2], Config: cfg}); err != nil {
			t.Fatalf("configure epoch 2 on %s: %v", id, err)
		}
	}
	eventually(t, 20*time.Second, func() error {
		resp, err := rcs[torn].Read(ctxT(t, 5*time.Second), &catenapb.FetchRequest{Stream: stream, Partition: 0, Offset: 0, MaxBytes: 1 << 20})
		if err != nil {
			return fmt.Errorf("read from the recovered member: %w", err)
		}
		if len(resp.GetRecords()) == 0 || resp.GetRecords()[0].GetOffset() != 0 {
			return fmt.Errorf("read from the recovered member at 0 returned %d records (committed %d)", len(resp.GetRecords()), resp.GetCommitted())
		}
		return nil
	})
}
