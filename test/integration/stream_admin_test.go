package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/catena-streams/catena/client"
)

// TestDevCreatesAndDeletesStreamsForClients: catena dev lets a client
// create a stream (catenactl stream create), masters it like those of
// --stream (through a kill -9 of every process and a restart that does not
// name it), and deletes it with every copy; bad requests change nothing.
func TestDevCreatesAndDeletesStreamsForClients(t *testing.T) {
	dir := t.TempDir()
	d := startDev(t, dir, "--stream", "demo:1")
	ctx := func() context.Context { return ctxT(t, 30*time.Second) }
	names := func(c *client.Client) []string {
		t.Helper()
		var out []string
		eventually(t, 10*time.Second, func() error {
			var err error
			out, err = c.ListStreams(ctx())
			return err
		})
		slices.Sort(out)
		return out
	}

	_, err := d.client.CreateStream(ctx(), "Bad_Name", 2)
	wantCode(t, err, codes.InvalidArgument, "a bad name")
	_, err = d.client.CreateStream(ctx(), "orders", 100000)
	wantCode(t, err, codes.InvalidArgument, "too many partitions")
	_, err = d.client.CreateStream(ctx(), "demo", 2)
	wantCode(t, err, codes.AlreadyExists, "a stream that exists")
	if got := names(d.client); !slices.Equal(got, []string{"demo"}) {
		t.Fatalf("after refused creates the streams are %v", got)
	}

	desc, err := d.client.CreateStream(ctx(), "orders", 3)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(desc.GetPartitions()) != 3 {
		t.Fatalf("created %d partitions, want 3", len(desc.GetPartitions()))
	}
	for _, p := range desc.GetPartitions() {
		if len(p.GetMembers()) != 3 {
			t.Errorf("partition %d has chain %v, want 3 members", p.GetPartition(), p.GetMembers())
		}
	}
	produce := func(c *client.Client, n int) {
		t.Helper()
		p := client.NewProducer(c, "orders", client.ProducerOptions{})
		defer p.Close()
		var fs []*client.Future
		for i := range n {
			fs = append(fs, p.Send(ctx(), client.Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte(fmt.Sprint("v", i))}))
		}
		for _, f := range fs {
			if _, err := f.Wait(); err != nil {
				t.Fatalf("produce to a created stream: %v", err)
			}
		}
	}
	produce(d.client, 30)

	// Every process killed; the next start names only demo.
	d.kill9All()
	d = startDev(t, dir, "--stream", "demo:1")
	if got := names(d.client); !slices.Equal(got, []string{"demo", "orders"}) {
		t.Fatalf("after a restart the streams are %v, want the created one too", got)
	}
	// Mastered again: every chain whole (the restarted members re-enter
	// at the tail first; a pipelined producer racing those epochs is the
	// client's business, tested elsewhere).
	waitWhole(t, d.seeds(), "orders", 3, 3, 60*time.Second)
	produce(d.client, 30)
	got, _ := readAll(t, d.client, "orders", 3)
	if len(got) != 60 {
		t.Fatalf("orders holds %d records after the restart, want 60", len(got))
	}

	if err := d.client.DeleteStream(ctx(), "orders"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got := names(d.client); !slices.Equal(got, []string{"demo"}) {
		t.Fatalf("after the delete the streams are %v", got)
	}
	wantCode(t, d.client.DeleteStream(ctx(), "orders"), codes.NotFound, "a second delete")
	_, err = d.client.Describe(ctx(), "orders")
	wantCode(t, err, codes.NotFound, "describing a deleted stream")

	// Gone for good: a restart does not bring it back.
	d.stop()
	d = startDev(t, dir, "--stream", "demo:1")
	if got := names(d.client); !slices.Equal(got, []string{"demo"}) {
		t.Fatalf("after another restart the streams are %v", got)
	}
}
