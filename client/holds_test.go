package client_test

import (
	"context"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestConsumerHolds(t *testing.T) {
	srv, c := setup(t, 2)
	ctx := context.Background()
	if err := c.CommitConsumerOffset(ctx, "s", 1, "ns/agg", 7); err != nil {
		t.Fatal(err)
	}
	if err := c.CommitConsumerOffset(ctx, "s", 1, "ns/agg", 4); err != nil {
		t.Fatal(err)
	}
	if got := srv.Holds("s", 1); !reflect.DeepEqual(got, map[string]uint64{"ns/agg": 4}) {
		t.Fatalf("holds %v, want ns/agg at 4 (set, not max)", got)
	}
	list, err := c.ListConsumers(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.GetPartitions(); len(ps) != 2 || len(ps[0].GetHolds()) != 0 || len(ps[1].GetHolds()) != 1 || ps[1].GetHolds()[0].GetOffset() != 4 {
		t.Fatalf("list %v", list)
	}
	for _, tc := range []struct {
		stream    string
		partition uint32
		consumer  string
		code      codes.Code
	}{
		{"s", 0, "Not/Valid", codes.InvalidArgument},
		{"missing", 0, "ns/agg", codes.NotFound},
		{"s", 5, "ns/agg", codes.NotFound},
	} {
		if err := c.CommitConsumerOffset(ctx, tc.stream, tc.partition, tc.consumer, 1); status.Code(err) != tc.code {
			t.Errorf("commit %s/%d %q: %v, want %v", tc.stream, tc.partition, tc.consumer, err, tc.code)
		}
	}
	if err := c.DeleteConsumer(ctx, "s", "ns/agg"); err != nil {
		t.Fatal(err)
	}
	if got := srv.Holds("s", 1); len(got) != 0 {
		t.Fatalf("holds %v after delete", got)
	}
	if err := c.DeleteConsumer(ctx, "s", ""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("delete without a name: %v", err)
	}
}
