package ingest

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestBuildRoutesTakesTheHighestEpoch(t *testing.T) {
	cfg := &catenapb.StreamConfig{Partitions: 2}
	m := func(ids ...string) []*catenapb.Member {
		out := make([]*catenapb.Member, len(ids))
		for i, id := range ids {
			out[i] = &catenapb.Member{Id: id, Addr: id + ":1"}
		}
		return out
	}
	reports := []*catenapb.StatusResponse{
		{ReplicaId: "a", Partitions: []*catenapb.PartitionStatus{
			{Stream: "s", Partition: 0, ReplicaId: "a", Epoch: 1, Members: m("a", "b", "c"), Config: cfg},
			{Stream: "s", Partition: 1, ReplicaId: "a", Epoch: 3, Members: m("b", "a"), Config: cfg},
			{Stream: "unconfigured", Partition: 0, ReplicaId: "a"},
		}},
		{ReplicaId: "b", Partitions: []*catenapb.PartitionStatus{
			{Stream: "s", Partition: 0, ReplicaId: "b", Epoch: 2, Members: m("b", "c"), Config: cfg},
			{Stream: "s", Partition: 1, ReplicaId: "b", Epoch: 3, Members: m("b", "a"), Config: cfg},
		}},
	}
	rt := buildRoutes(reports, nil)
	if got := rt.streamNames(); !reflect.DeepEqual(got, []string{"s"}) {
		t.Fatalf("streams %v, want [s] (unconfigured partitions are not routes)", got)
	}
	sr := rt.streams["s"]
	if len(sr.partitions) != 2 {
		t.Fatalf("%d partitions, want 2", len(sr.partitions))
	}
	p0 := sr.partitions[0]
	if p0.epoch != 2 || p0.head().GetId() != "b" {
		t.Fatalf("partition 0: epoch %d head %s, want epoch 2 head b (a member still at epoch 1 loses)", p0.epoch, p0.head().GetId())
	}
	if got := []string{p0.readOrder()[0].GetId(), p0.readOrder()[1].GetId()}; !reflect.DeepEqual(got, []string{"c", "b"}) {
		t.Fatalf("read order %v, want tail first", got)
	}
	if len(sr.partitions[1].reports) != 2 {
		t.Fatalf("partition 1 has %d member reports, want 2", len(sr.partitions[1].reports))
	}
	if rt.replicas["c"] != "c:1" {
		t.Fatalf("replica c learned at %q", rt.replicas["c"])
	}
}

func TestPartitionForIsStableAndSpreads(t *testing.T) {
	// The mapping is part of the contract with producers: pin a few values.
	for key, want := range map[string]uint32{"k1": PartitionFor([]byte("k1"), 4), "": PartitionFor(nil, 4)} {
		if got := PartitionFor([]byte(key), 4); got != want {
			t.Fatalf("PartitionFor(%q) not stable: %d then %d", key, want, got)
		}
	}
	counts := make([]int, 8)
	for i := range 8000 {
		counts[PartitionFor([]byte{byte(i), byte(i >> 8), 'k'}, 8)]++
	}
	for p, n := range counts {
		if n < 700 || n > 1300 {
			t.Fatalf("partition %d got %d of 8000 keys: %v", p, n, counts)
		}
	}
}

func TestSplitChunksBoundsAppendSize(t *testing.T) {
	recs := make([]*catenapb.ProduceRecord, 10)
	idx := make([]int, len(recs))
	for i := range recs {
		recs[i] = &catenapb.ProduceRecord{Value: make([]byte, maxAppendBytes/4)}
		idx[i] = i
	}
	chunks := splitChunks(idx, recs)
	var seen []int
	for _, c := range chunks {
		size := 0
		for _, i := range c {
			size += len(recs[i].GetValue())
		}
		if size > maxAppendBytes {
			t.Fatalf("chunk of %d bytes exceeds %d", size, maxAppendBytes)
		}
		seen = append(seen, c...)
	}
	if !reflect.DeepEqual(seen, idx) {
		t.Fatalf("chunks %v lose or reorder records", chunks)
	}
	if one := splitChunks([]int{0}, []*catenapb.ProduceRecord{{Value: make([]byte, 2*maxAppendBytes)}}); len(one) != 1 {
		t.Fatalf("an oversized single record must still make one chunk, got %v", one)
	}
	// Many small records: no chunk holds more than one frame's records.
	small := make([]*catenapb.ProduceRecord, partlog.MaxBatchRecords+10)
	idx = make([]int, len(small))
	for i := range idx {
		small[i], idx[i] = &catenapb.ProduceRecord{}, i
	}
	total := 0
	for _, c := range splitChunks(idx, small) {
		if len(c) > partlog.MaxBatchRecords {
			t.Fatalf("chunk of %d records, above %d", len(c), partlog.MaxBatchRecords)
		}
		total += len(c)
	}
	if total != len(small) {
		t.Fatalf("chunks hold %d records of %d", total, len(small))
	}
}

func TestSequencerAdmitsInProducerOrder(t *testing.T) {
	s := newSequencer()
	ctx := context.Background()
	s.admit(ctx, 1, admission{prevSeq: 0, lastSeq: 10})() // first request: no predecessor
	order := make(chan int, 3)
	admitted := make(chan struct{})
	// Request 3 (21..30, predecessor ends at 20) arrives before request 2
	// (11..20, predecessor ends at 10): it must wait.
	go func() {
		release := s.admit(ctx, 1, admission{prevSeq: 20, lastSeq: 30})
		order <- 3
		release()
		close(admitted)
	}()
	select {
	case <-order:
		t.Fatal("request 3 was admitted before request 2")
	case <-time.After(50 * time.Millisecond):
	}
	release := s.admit(ctx, 1, admission{prevSeq: 10, lastSeq: 20})
	order <- 2
	release()
	<-admitted
	if a, b := <-order, <-order; a != 2 || b != 3 {
		t.Fatalf("admitted %d then %d, want 2 then 3", a, b)
	}
	// A retry (no predecessor named) passes at once; so does another producer.
	done := make(chan struct{})
	go func() {
		s.admit(ctx, 1, admission{prevSeq: 0, lastSeq: 9})()
		s.admit(ctx, 2, admission{prevSeq: 0, lastSeq: 100})()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("a retry or another producer was held back")
	}
}

func TestSequencerFirstRequestsOutOfOrder(t *testing.T) {
	// A new producer's second request reaching ingestion before its first
	// (the bug the integration suite caught) must wait for the first.
	s := newSequencer()
	ctx := context.Background()
	second := make(chan struct{})
	go func() { s.admit(ctx, 7, admission{prevSeq: 5, lastSeq: 9})(); close(second) }()
	select {
	case <-second:
		t.Fatal("the second request was admitted before the first")
	case <-time.After(50 * time.Millisecond):
	}
	s.admit(ctx, 7, admission{prevSeq: 0, lastSeq: 5})()
	select {
	case <-second:
	case <-time.After(time.Second):
		t.Fatal("the second request was not admitted after the first")
	}
}

func TestSequencerGivesUpOnALostPredecessor(t *testing.T) {
	s := newSequencer()
	ctx := context.Background()
	s.admit(ctx, 1, admission{prevSeq: 0, lastSeq: 1})()
	start := time.Now()
	s.admit(ctx, 1, admission{prevSeq: 49, lastSeq: 60})() // the request ending at 49 never arrives
	if waited := time.Since(start); waited < admitWait/2 {
		t.Fatalf("waited %v for a lost predecessor, want about %v", waited, admitWait)
	}
	// After giving up, the order continues from the admitted request.
	done := make(chan struct{})
	go func() { s.admit(ctx, 1, admission{prevSeq: 60, lastSeq: 70})(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("the next request in order was held back")
	}
}

// TestRouteRecords: a named partition wins, then the key's; a request's
// records with neither share one partition, picked once per request (and
// not at all when there are none), so consecutive requests rotate.
func TestRouteRecords(t *testing.T) {
	keyed := func(k string) *catenapb.ProduceRecord { return &catenapb.ProduceRecord{Key: []byte(k)} }
	named := func(p uint32) *catenapb.ProduceRecord {
		return &catenapb.ProduceRecord{Partition: &p, Key: []byte("ignored")}
	}
	free := func() *catenapb.ProduceRecord { return &catenapb.ProduceRecord{Value: []byte("v")} }
	const n, o = 4, partlog.MaxRecordOverhead
	tests := []struct {
		name  string
		recs  []*catenapb.ProduceRecord
		picks int // 0 or 1
		bytes int // the keyless records' size, when picked: values plus overheads
		want  []uint32
	}{
		{"keyless share the pick", []*catenapb.ProduceRecord{free(), free(), free()}, 1, 3 * (1 + o), []uint32{2, 2, 2}},
		{"keys and names are not sticky", []*catenapb.ProduceRecord{keyed("a"), named(3), keyed("b")}, 0, 0,
			[]uint32{PartitionFor([]byte("a"), n), 3, PartitionFor([]byte("b"), n)}},
		{"mixed", []*catenapb.ProduceRecord{free(), keyed("a"), named(0), free()}, 1, 2 * (1 + o),
			[]uint32{2, PartitionFor([]byte("a"), n), 0, 2}},
		{"empty key is no key", []*catenapb.ProduceRecord{keyed(""), free()}, 1, o + 1 + o, []uint32{2, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			picks, bytes := 0, 0
			got := routeRecords(tc.recs, n, func(b int) uint32 { picks++; bytes = b; return 2 })
			if !slices.Equal(got, tc.want) || picks != tc.picks || bytes != tc.bytes {
				t.Fatalf("got %v with %d picks for %d bytes, want %v with %d for %d", got, picks, bytes, tc.want, tc.picks, tc.bytes)
			}
		})
	}
}

func TestKeylessPickerSticksThenMovesOn(t *testing.T) {
	defer func(old int) { stickyBytes = old }(stickyBytes)
	stickyBytes = 100
	const n = 3
	var k keylessPicker
	// Requests of 40 bytes: three to a partition (the third crosses the
	// threshold), then the next partition, around the ring.
	var got []uint32
	for range 10 {
		got = append(got, k.pick(n, 40))
	}
	if want := []uint32{0, 0, 0, 1, 1, 1, 2, 2, 2, 0}; !slices.Equal(got, want) {
		t.Fatalf("picks %v, want %v", got, want)
	}
	// A request larger than the threshold has a partition to itself.
	k = keylessPicker{}
	if a, b, c := k.pick(n, 500), k.pick(n, 1), k.pick(n, 1); a != 0 || b != 1 || c != 1 {
		t.Fatalf("picks %d %d %d, want 0 1 1", a, b, c)
	}
	// The partition count of the request bounds the pick.
	k = keylessPicker{current: 7}
	if p := k.pick(4, 1); p != 3 {
		t.Fatalf("pick %d of 4 partitions, want 3", p)
	}
}

// A producer that batches per partition sends an older partition's batch
// after a newer one's: request 3 (sequences 5..9) follows request 2
// (sequences 40..60). Ordered by sequence, request 4 (naming request 3's
// last sequence, 9) would pass as soon as request 2 was admitted, before
// request 3; ordered by number it waits for request 3 itself.
func TestSequencerOrdersNumberedRequestsWhateverTheirSequences(t *testing.T) {
	s := newSequencer()
	ctx := context.Background()
	s.admit(ctx, 1, admission{lastSeq: 4, req: 1})()
	s.admit(ctx, 1, admission{lastSeq: 60, req: 2, prevReq: 1})()
	admitted := make(chan struct{})
	go func() {
		s.admit(ctx, 1, admission{prevSeq: 9, lastSeq: 70, req: 4, prevReq: 3})()
		close(admitted)
	}()
	select {
	case <-admitted:
		t.Fatal("request 4 was admitted before request 3")
	case <-time.After(50 * time.Millisecond):
	}
	s.admit(ctx, 1, admission{prevSeq: 60, lastSeq: 9, req: 3, prevReq: 2})()
	select {
	case <-admitted:
	case <-time.After(time.Second):
		t.Fatal("request 4 was not admitted after request 3")
	}
}
