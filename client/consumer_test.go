package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func appendN(srv interface {
	Append(string, int, ...*catenapb.Record)
}, partition, n int, tsMs func(i int) int64) {
	for i := range n {
		srv.Append("s", partition, &catenapb.Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte(fmt.Sprint("v", i)), TimestampMs: tsMs(i)})
	}
}

func TestFetch(t *testing.T) {
	srv, c := setup(t, 2)
	appendN(srv, 1, 10, func(i int) int64 { return 1000 + int64(i) })
	ctx := context.Background()
	r, err := c.Fetch(ctx, "s", 1, 3, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Messages) != 7 || r.Messages[0].Offset != 3 || string(r.Messages[0].Value) != "v3" || r.NextOffset != 10 || r.Committed != 10 {
		t.Fatalf("fetch = %+v", r)
	}
	if m := r.Messages[0]; m.Partition != 1 || m.Stream != "s" || m.TimestampMs != 1003 {
		t.Fatalf("message = %+v", m)
	}
	// Long-poll returns when a record commits.
	done := make(chan *client.FetchResult, 1)
	go func() {
		r, _ := c.Fetch(ctx, "s", 0, 0, 0, 10*time.Second)
		done <- r
	}()
	srv.Append("s", 0, &catenapb.Record{Value: []byte("late")})
	select {
	case r := <-done:
		if r == nil || len(r.Messages) != 1 || string(r.Messages[0].Value) != "late" {
			t.Fatalf("long poll = %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long poll did not return")
	}
	if _, err := c.Fetch(ctx, "missing", 0, 0, 0, 0); status.Code(err) != codes.NotFound {
		t.Fatalf("missing stream: %v", err)
	}
}

func TestSubscribePositions(t *testing.T) {
	srv, c := setup(t, 1)
	appendN(srv, 0, 5, func(i int) int64 { return 1000 * int64(i+1) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cases := []struct {
		pos  client.Position
		want uint64
	}{
		{client.Earliest, 0},
		{client.AtOffset(2), 2},
		{client.AtTimeMs(2500), 2},
		{client.AtTime(time.UnixMilli(4000)), 3},
		{client.Latest, 5},
	}
	for _, tc := range cases {
		off, err := c.Resolve(ctx, "s", 0, tc.pos)
		if err != nil || off != tc.want {
			t.Fatalf("Resolve(%v) = %d, %v; want %d", tc.pos, off, err, tc.want)
		}
	}
	sub, err := c.Subscribe(ctx, "s", 0, client.AtOffset(3))
	if err != nil {
		t.Fatal(err)
	}
	for want := uint64(3); want < 5; want++ {
		m, err := sub.Next()
		if err != nil || m.Offset != want {
			t.Fatalf("Next = %+v, %v; want offset %d", m, err, want)
		}
	}
	// Records committed later are streamed.
	go srv.Append("s", 0, &catenapb.Record{Value: []byte("new")})
	m, err := sub.Next()
	if err != nil || m.Offset != 5 || string(m.Value) != "new" {
		t.Fatalf("Next = %+v, %v", m, err)
	}
	if sub.Offset() != 6 || sub.Committed() < 5 {
		t.Fatalf("offset %d committed %d", sub.Offset(), sub.Committed())
	}
	sub.Close()
	if _, err := sub.Next(); err == nil {
		t.Fatal("Next after Close succeeded")
	}
	// Latest only sees new records; All stops cleanly on cancel.
	sub2, err := c.Subscribe(ctx, "s", 0, client.Latest)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Append("s", 0, &catenapb.Record{Value: []byte("newer")})
	n := 0
	for m, err := range sub2.All() {
		if err != nil {
			t.Fatal(err)
		}
		if m.Offset != 6 {
			t.Fatalf("latest subscription got offset %d", m.Offset)
		}
		n++
		cancel()
	}
	if n != 1 {
		t.Fatalf("%d messages", n)
	}
}

func TestSubscribeReconnects(t *testing.T) {
	srv, c := setup(t, 1)
	appendN(srv, 0, 3, func(int) int64 { return 1 })
	ctx := context.Background()
	sub, err := c.Subscribe(ctx, "s", 0, client.Earliest, client.SubscribeOptions{ReconnectBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for want := range uint64(3) {
		if m, err := sub.Next(); err != nil || m.Offset != want {
			t.Fatalf("%+v %v", m, err)
		}
	}
	// The stream breaks while waiting; Next re-subscribes from offset 3.
	got := make(chan client.Message, 1)
	go func() {
		m, err := sub.Next()
		if err != nil {
			t.Error(err)
		}
		got <- m
	}()
	srv.BreakSubscriptions()
	srv.Append("s", 0, &catenapb.Record{Value: []byte("after")})
	select {
	case m := <-got:
		if m.Offset != 3 || string(m.Value) != "after" {
			t.Fatalf("after reconnect: %+v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no record after reconnect")
	}
	if _, err := c.Subscribe(ctx, "nope", 0, client.Earliest); status.Code(err) != codes.NotFound {
		t.Fatalf("subscribe to missing stream: %v", err)
	}
}

func TestDescribeAndList(t *testing.T) {
	srv, c := setup(t, 3)
	srv.AddStream("a", 1)
	ctx := context.Background()
	names, err := c.ListStreams(ctx)
	if err != nil || len(names) != 2 || names[0] != "a" || names[1] != "s" {
		t.Fatalf("ListStreams = %v, %v", names, err)
	}
	d, err := c.Describe(ctx, "s")
	if err != nil || len(d.Partitions) != 3 || d.Config.Partitions != 3 {
		t.Fatalf("Describe = %v, %v", d, err)
	}
	if _, err := c.Describe(ctx, "x"); status.Convert(err).Message() != `stream "x" not found` {
		t.Fatalf("describe missing: %v", err)
	}
}

func TestParsePosition(t *testing.T) {
	for in, want := range map[string]string{"earliest": "earliest", "LATEST": "latest", "42": "42", "@1700000000000": "@1700000000000"} {
		p, err := client.ParsePosition(in)
		if err != nil || p.String() != want {
			t.Fatalf("ParsePosition(%q) = %v, %v", in, p, err)
		}
	}
	for _, bad := range []string{"", "-1", "@x", "soon", "1.5"} {
		if _, err := client.ParsePosition(bad); err == nil {
			t.Fatalf("ParsePosition(%q) accepted", bad)
		}
	}
}
