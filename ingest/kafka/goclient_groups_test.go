package kafka

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
)

// goMember is a member of a group through Catena's Go client: it polls,
// then commits what it polled, unless told to stop committing.
type goMember struct {
	net      *severable
	cl       *client.Client
	gc       *client.GroupConsumer
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	consumed map[string]bool
	noCommit bool
	// first is the first message the member read.
	first *client.Message
}

func (c *cluster) goGroupMember(t *testing.T, name, group string) *goMember {
	t.Helper()
	m := &goMember{net: &severable{}, done: make(chan struct{}), consumed: map[string]bool{}}
	var err error
	m.cl, err = client.Dial(context.Background(), c.grpcAddr, client.WithDialOptions(grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return m.net.dial(ctx, "tcp", addr)
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.cl.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.gc, err = m.cl.JoinGroup(ctx, client.GroupOptions{Group: group, Stream: "s", ClientID: name, SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-m.done
	})
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			msgs, err := m.gc.Poll(ctx)
			if err != nil {
				if ctx.Err() == nil {
					t.Logf("%s: poll: %v", name, err)
					time.Sleep(100 * time.Millisecond)
				}
				continue
			}
			m.mu.Lock()
			for _, r := range msgs {
				m.consumed[fmt.Sprintf("%d/%d", r.Partition, r.Offset)] = true
			}
			if m.first == nil && len(msgs) > 0 {
				m.first = &msgs[0]
			}
			noCommit := m.noCommit
			m.mu.Unlock()
			if !noCommit {
				_ = m.gc.Commit(ctx)
			}
		}
	}()
	return m
}

func (m *goMember) read() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for k := range m.consumed {
		out[k] = true
	}
	return out
}

// TestAGoMemberReadsManyPartitionsAtOnce: a Go member's generation starts
// a reader per partition, and Poll records each batch's position while
// readers of other partitions are still starting. The generation's start
// offsets were the same map as the positions Poll writes, read by each
// reader as it started: a data race, caught once by CI under -race in
// TestGoClientReachesTheCoordinatorThroughAnyNode. The race detector sees
// it only when a reader starts after Poll's first write, which the
// scheduler decides; sixteen partitions with records waiting make that
// likelier, not certain (five runs of this test before the fix passed).
func TestAGoMemberReadsManyPartitionsAtOnce(t *testing.T) {
	const partitions = 16
	c := startCluster(t, partitions)
	all := c.produceN(t, partitions, 5)
	m := c.goGroupMember(t, "go", "many")
	waitFor(t, 30*time.Second, "the member to read every record", func() bool { return len(m.read()) == len(all) })
	got := m.read()
	for _, k := range all {
		if !got[k] {
			t.Fatalf("record %s was never read", k)
		}
	}
}

// TestGoClientAndKafkaClientShareAGroup: two members through Catena's Go
// client and one franz-go member (range) form one group; one Go member
// is killed (its connections cut, no LeaveGroup) after reading records it
// never commits, and the two others read every record it did not commit.
func TestGoClientAndKafkaClientShareAGroup(t *testing.T) {
	const partitions = 6
	c := startCluster(t, partitions)
	all := c.produceN(t, partitions, 50)
	const group = "mixed"
	goA := c.goGroupMember(t, "go-a", group)
	goB := c.goGroupMember(t, "go-b", group)
	kafkaMember := c.groupMember(t, "kgo", group, kgo.RangeBalancer())
	adm := kadm.NewClient(c.client())
	ctx := ctxT(t, 90*time.Second)
	union := func() map[string]bool {
		out := goA.read()
		for k := range kafkaMember.consumed2() {
			out[k] = true
		}
		return out
	}
	waitFor(t, 30*time.Second, "a stable group of three that read the first 300 records", func() bool {
		got := union()
		for k := range goB.read() {
			got[k] = true
		}
		d, err := adm.DescribeGroups(ctx, group)
		return len(got) >= len(all) && err == nil && d[group].State == "Stable" && len(d[group].Members) == 3 &&
			len(goA.gc.Assigned()) == 2 && len(goB.gc.Assigned()) == 2
	})

	goB.mu.Lock()
	goB.noCommit = true
	goB.mu.Unlock()
	committedByB := goB.read()
	all = append(all, c.produceN(t, partitions, 50)...)
	waitFor(t, 30*time.Second, "the victim to read some of the next records", func() bool {
		return len(goB.read()) > len(committedByB)
	})
	goB.net.kill()
	goB.cancel()
	<-goB.done
	all = append(all, c.produceN(t, partitions, 50)...)

	waitFor(t, 60*time.Second, "the survivors to read every record the victim did not commit", func() bool {
		got := union()
		for k := range committedByB {
			got[k] = true
		}
		for _, k := range all {
			if !got[k] {
				return false
			}
		}
		return true
	})
	d, err := adm.DescribeGroups(ctx, group)
	if err != nil || len(d[group].Members) != 2 {
		t.Fatalf("described %+v (%v), want the 2 survivors", d[group], err)
	}
	if n := len(goA.gc.Assigned()); n != 3 {
		t.Fatalf("the surviving Go member has partitions %v, want 3 of 6", goA.gc.Assigned())
	}
	// A message of the first generation is not committed in the second:
	// its offset may be behind what another member committed since.
	goA.mu.Lock()
	first := *goA.first
	goA.mu.Unlock()
	if err := goA.gc.CommitMessages(ctx, first); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("committing a message of an earlier generation: %v, want FailedPrecondition", err)
	}
	goA.cancel()
	<-goA.done
	if err := goA.gc.Close(ctx); err != nil {
		t.Fatalf("leave: %v", err)
	}
}

func (m *member) consumed2() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for k := range m.consumed {
		out[k] = true
	}
	return out
}
