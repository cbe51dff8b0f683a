package server

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// TestHeadUnreachableReportsReachTheMaster: an ingestion node's report
// that it cannot reach the head is taken by the head's successor at the
// same epoch only, and shown in its Status (head_unreachable_ms) for the
// chain's master; a stale reporter is told so and changes nothing.
func TestHeadUnreachableReportsReachTheMaster(t *testing.T) {
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	configure(t, 3, a, b, c)
	ctx := context.Background()
	report := func(n *node, epoch uint64, head string, downMs uint64) error {
		_, err := client(t, n.addr).ReportHeadUnreachable(ctx, &catenapb.ReportHeadUnreachableRequest{
			Stream: "s", Partition: 0, Epoch: epoch, HeadId: head, DownMs: downMs, Reporter: "ingest-0"})
		return err
	}
	if st := status0(t, b); st.GetHeadUnreachableMs() != 0 {
		t.Fatalf("no report yet, head unreachable for %d ms", st.GetHeadUnreachableMs())
	}
	for _, tc := range []struct {
		name  string
		to    *node
		epoch uint64
		head  string
		want  codes.Code
	}{
		{"an older epoch", b, 2, "a", codes.FailedPrecondition},
		{"a newer epoch", b, 4, "a", codes.FailedPrecondition},
		{"a member that is not the head", b, 3, "c", codes.FailedPrecondition},
		{"to the tail", c, 3, "a", codes.FailedPrecondition},
		{"to the head itself", a, 3, "a", codes.FailedPrecondition},
		{"no head named", b, 3, "", codes.InvalidArgument},
	} {
		if err := report(tc.to, tc.epoch, tc.head, 700); status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, n := range []*node{a, b, c} {
		if st := status0(t, n); st.GetHeadUnreachableMs() != 0 {
			t.Fatalf("refused reports changed %s's status: head unreachable for %d ms", n.id, st.GetHeadUnreachableMs())
		}
	}

	if err := report(b, 3, "a", 700); err != nil {
		t.Fatalf("report to the head's successor: %v", err)
	}
	if st := status0(t, b); st.GetHeadUnreachableMs() != 700 {
		t.Fatalf("head unreachable for %d ms, want the report's 700", st.GetHeadUnreachableMs())
	}
	// A second ingestion node that has only begun to stall does not hide
	// the first's longer report.
	if _, err := client(t, b.addr).ReportHeadUnreachable(ctx, &catenapb.ReportHeadUnreachableRequest{
		Stream: "s", Partition: 0, Epoch: 3, HeadId: "a", DownMs: 150, Reporter: "ingest-1"}); err != nil {
		t.Fatalf("second reporter: %v", err)
	}
	if st := status0(t, b); st.GetHeadUnreachableMs() != 700 {
		t.Fatalf("head unreachable for %d ms after a shorter second report, want the longest fresh one, 700", st.GetHeadUnreachableMs())
	}
	// A new epoch (the master acted, or the chain moved on) ends it.
	configure(t, 4, a, b, c)
	if st := status0(t, b); st.GetHeadUnreachableMs() != 0 {
		t.Fatalf("a report from epoch 3 shows at epoch 4: %d ms", st.GetHeadUnreachableMs())
	}
}

// TestAReportCarriesEveryChainOfTheHead: one call reports the head of
// several chains; each chain this replica is the head's successor of
// records it, one it is not is passed over, and the call fails only when
// no chain took it.
func TestAReportCarriesEveryChainOfTheHead(t *testing.T) {
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	cfg := proto.Clone(testConfig).(*catenapb.StreamConfig)
	cfg.Partitions = 3
	ctx := context.Background()
	for part, chain := range [][]*node{{a, b, c}, {a, b, c}, {c, a, b}} {
		req := &catenapb.ConfigureRequest{Stream: "s", Partition: uint32(part), Epoch: 3, Members: members(chain...), Config: cfg}
		for i := len(chain) - 1; i >= 0; i-- {
			if _, err := client(t, chain[i].addr).Configure(ctx, req); err != nil {
				t.Fatalf("configure %s/%d: %v", chain[i].id, part, err)
			}
		}
	}
	headMs := func(part uint32) uint64 {
		resp, err := client(t, b.addr).Status(ctx, &catenapb.StatusRequest{Stream: "s", Partition: &part})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetPartitions()[0].GetHeadUnreachableMs()
	}
	// Partition 2's head is c: b is not its second member.
	if _, err := client(t, b.addr).ReportHeadUnreachable(ctx, &catenapb.ReportHeadUnreachableRequest{
		Stream: "s", Partition: 2, Epoch: 3, HeadId: "a", DownMs: 400, Reporter: "ingest-0"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a report of no chain b takes: %v", err)
	}
	if _, err := client(t, b.addr).ReportHeadUnreachable(ctx, &catenapb.ReportHeadUnreachableRequest{
		Stream: "s", Partition: 2, Epoch: 3, HeadId: "a", DownMs: 400, Reporter: "ingest-0",
		More: []*catenapb.HeadReportChain{{Stream: "s", Partition: 0, Epoch: 3, DownMs: 500}, {Stream: "s", Partition: 1, Epoch: 3, DownMs: 600}, {Stream: "s", Partition: 1, Epoch: 2, DownMs: 900}},
	}); err != nil {
		t.Fatalf("a report of three chains, two of them b's: %v", err)
	}
	for part, want := range []uint64{500, 600, 0} {
		if got := headMs(uint32(part)); got != want {
			t.Errorf("partition %d: head unreachable for %d ms, want %d", part, got, want)
		}
	}
}
