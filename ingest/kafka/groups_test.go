package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// severable dials connections that can all be cut at once, as a killed
// process's are: its client sends nothing more, not even a LeaveGroup.
type severable struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

func (s *severable) dial(ctx context.Context, network, host string) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return nil, errors.New("killed")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err == nil {
		s.conns = append(s.conns, c)
	}
	return c, err
}

func (s *severable) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
	for _, c := range s.conns {
		c.Close()
	}
}

// member is one consumer of a group: it reads, then commits what it read.
type member struct {
	name     string
	cl       *kgo.Client
	net      *severable
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	consumed map[string]bool // "partition/offset"
	// committed are the records whose commit was answered.
	committed map[string]bool
	// noCommit: read but do not commit (the process dies first).
	noCommit bool
}

func recordKey(r *kgo.Record) string { return fmt.Sprintf("%d/%d", r.Partition, r.Offset) }

func (c *cluster) groupMember(t *testing.T, name, group string, balancer kgo.GroupBalancer) *member {
	m := &member{name: name, net: &severable{}, done: make(chan struct{}), consumed: map[string]bool{}, committed: map[string]bool{}}
	m.cl = c.client(kgo.Dialer(m.net.dial), kgo.ClientID(name),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics("s"), kgo.Balancers(balancer),
		kgo.DisableAutoCommit(), kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(300*time.Millisecond),
		kgo.FetchMaxWait(200*time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	// Stopped before the client closes (cleanups run last first): a
	// closed client's poll returns at once, and the loop would spin.
	t.Cleanup(func() {
		cancel()
		<-m.done
	})
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			fs := m.cl.PollFetches(ctx)
			recs := fs.Records()
			m.mu.Lock()
			for _, r := range recs {
				m.consumed[recordKey(r)] = true
			}
			noCommit := m.noCommit
			m.mu.Unlock()
			if len(recs) == 0 || noCommit {
				continue
			}
			if err := m.cl.CommitRecords(ctx, recs...); err != nil {
				continue
			}
			m.mu.Lock()
			for _, r := range recs {
				m.committed[recordKey(r)] = true
			}
			m.mu.Unlock()
		}
	}()
	return m
}

func (m *member) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.consumed)
}

// produceN produces n records of 1 KiB to every partition of "s" and
// returns their keys.
func (c *cluster) produceN(t *testing.T, partitions, n int) []string {
	t.Helper()
	cl := c.client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx := ctxT(t, 60*time.Second)
	var recs []*kgo.Record
	for p := range partitions {
		for i := range n {
			recs = append(recs, &kgo.Record{Topic: "s", Partition: int32(p), Value: fmt.Appendf(nil, "p%d-%d", p, i)})
		}
	}
	var keys []string
	for _, r := range cl.ProduceSync(ctx, recs...) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		keys = append(keys, recordKey(r.Record))
	}
	return keys
}

// TestConsumerGroupThroughAMemberKill runs a group of three franz-go
// consumers with each assignor; one is killed (its connections cut, no
// LeaveGroup) after reading records it never commits. The other two must
// rebalance once its session expires, resume its partitions from their
// committed offsets and so read every record no member committed: none
// is skipped.
func TestConsumerGroupThroughAMemberKill(t *testing.T) {
	for _, bal := range []struct {
		name string
		b    kgo.GroupBalancer
	}{
		{"range", kgo.RangeBalancer()},
		{"cooperative-sticky", kgo.CooperativeStickyBalancer()},
	} {
		t.Run(bal.name, func(t *testing.T) {
			const partitions = 6
			c := startCluster(t, partitions)
			all := c.produceN(t, partitions, 50)
			group := "g-" + bal.name
			var members []*member
			for i := range 3 {
				members = append(members, c.groupMember(t, fmt.Sprintf("m%d", i), group, bal.b))
			}
			adm := kadm.NewClient(c.client())
			ctx := ctxT(t, 90*time.Second)
			waitFor(t, 30*time.Second, "a stable group of three that read the first 300 records", func() bool {
				n := 0
				for _, m := range members {
					n += m.count()
				}
				described, err := adm.DescribeGroups(ctx, group)
				return n >= len(all) && err == nil && described[group].State == "Stable" && len(described[group].Members) == 3
			})

			// The victim reads the next records but dies before committing.
			victim := members[2]
			victim.mu.Lock()
			victim.noCommit = true
			victim.mu.Unlock()
			before := victim.count()
			all = append(all, c.produceN(t, partitions, 50)...)
			waitFor(t, 30*time.Second, "the victim to read some of the next records", func() bool {
				return victim.count() > before
			})
			t.Logf("killing %s, which read %d records", victim.name, victim.count())
			victim.net.kill()
			victim.cancel()
			<-victim.done

			all = append(all, c.produceN(t, partitions, 50)...)
			survivors := members[:2]
			read := func() map[string]bool {
				out := map[string]bool{}
				for _, m := range survivors {
					m.mu.Lock()
					for k := range m.consumed {
						out[k] = true
					}
					m.mu.Unlock()
				}
				victim.mu.Lock()
				for k := range victim.committed {
					out[k] = true
				}
				victim.mu.Unlock()
				return out
			}
			waitFor(t, 60*time.Second, "the survivors to read every record the victim did not commit", func() bool {
				got := read()
				for _, k := range all {
					if !got[k] {
						return false
					}
				}
				return true
			})
			t.Logf("survivors read everything")
			described, err := adm.DescribeGroups(ctx, group)
			if err != nil || len(described[group].Members) != 2 {
				t.Fatalf("described %+v (%v), want the 2 survivors", described[group], err)
			}

			// Every partition is committed to its end, and held there from
			// retention under the group's hold.
			waitFor(t, 30*time.Second, "the survivors' last commits", func() bool {
				offs, err := adm.FetchOffsets(ctx, group)
				if err != nil {
					return false
				}
				for p := range partitions {
					o, ok := offs.Lookup("s", int32(p))
					if !ok || o.At != 150 {
						return false
					}
				}
				return true
			})
			holds, err := c.ing.ListConsumers(ctx, &catenapb.ListConsumersRequest{Stream: "s"})
			if err != nil {
				t.Fatal(err)
			}
			held := 0
			for _, p := range holds.GetPartitions() {
				for _, h := range p.GetHolds() {
					if h.GetConsumer() == groups.HoldName(group) && h.GetOffset() == 150 {
						held++
					}
				}
			}
			if held != partitions {
				t.Fatalf("holds %v: want %s at 150 on each of %d partitions", holds.GetPartitions(), groups.HoldName(group), partitions)
			}
		})
	}
}

// TestCommittedOffsetsSurviveACoordinatorRestart commits through one
// listener and fetches through a new one on the same chains: the offsets
// come back from the offsets stream.
func TestCommittedOffsetsSurviveACoordinatorRestart(t *testing.T) {
	c := startCluster(t, 2)
	c.produceN(t, 2, 10)
	ctx := ctxT(t, 30*time.Second)
	adm := kadm.NewClient(c.client())
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: "s", Partition: 0, At: 4, LeaderEpoch: -1, Metadata: "m0"})
	offs.Add(kadm.Offset{Topic: "s", Partition: 1, At: 9, LeaderEpoch: -1})
	resp, err := adm.CommitOffsets(ctx, "manual", offs)
	if err := errors.Join(err, resp.Error()); err != nil {
		t.Fatal(err)
	}

	// A record that is not an offsets record (written around the Kafka
	// listener, which refuses the stream) is skipped, not fatal.
	zero := uint32(0)
	if _, err := c.ing.Produce(ctx, &catenapb.ProduceRequest{Stream: groups.DefaultOffsetsStream, Records: []*catenapb.ProduceRecord{{Value: []byte("not json"), Partition: &zero}}}); err != nil {
		t.Fatal(err)
	}

	restarted, err := New(Options{Ingest: c.ing})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = restarted.Serve(lis) }()
	t.Cleanup(restarted.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(lis.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	fetched, err := kadm.NewClient(cl).FetchOffsets(ctx, "manual")
	if err != nil {
		t.Fatal(err)
	}
	o0, _ := fetched.Lookup("s", 0)
	o1, _ := fetched.Lookup("s", 1)
	if o0.At != 4 || o0.Metadata != "m0" || o1.At != 9 {
		t.Fatalf("after the restart: %+v %+v, want 4 (m0) and 9", o0, o1)
	}
}

// TestGroupRefusals: the coordinator's refusals reach the client as
// Kafka's error codes.
func TestGroupRefusals(t *testing.T) {
	c := startCluster(t, 1)
	cl := c.client()
	ctx := ctxT(t, 30*time.Second)

	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group, hb.MemberID, hb.Generation = "nobody-home", "m", 1
	if r, err := hb.RequestWith(ctx, cl); err != nil || r.ErrorCode != kerr.UnknownMemberID.Code {
		t.Fatalf("heartbeat of no member: %+v %v", r, err)
	}

	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.ProtocolType, join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = "g", "consumer", 100, 1000
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range"}}
	if r, err := join.RequestWith(ctx, cl); err != nil || r.ErrorCode != kerr.InvalidSessionTimeout.Code {
		t.Fatalf("join with a 100 ms session: %+v %v", r, err)
	}

	commit := kmsg.NewPtrOffsetCommitRequest()
	commit.Group, commit.Generation = "g", -1
	ct := kmsg.NewOffsetCommitRequestTopic()
	ct.Topic = "nope"
	ct.Partitions = []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1}}
	st := kmsg.NewOffsetCommitRequestTopic()
	st.Topic = "s"
	st.Partitions = []kmsg.OffsetCommitRequestTopicPartition{{Partition: 3, Offset: 1}, {Partition: 0, Offset: 1, Metadata: kmsg.StringPtr(string(make([]byte, 5000)))}}
	commit.Topics = []kmsg.OffsetCommitRequestTopic{ct, st}
	r, err := commit.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	want := []int16{kerr.UnknownTopicOrPartition.Code, kerr.UnknownTopicOrPartition.Code, kerr.OffsetMetadataTooLarge.Code}
	var codes []int16
	for _, tp := range r.Topics {
		for _, p := range tp.Partitions {
			codes = append(codes, p.ErrorCode)
		}
	}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Fatalf("commit codes %v, want %v", codes, want)
	}
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, "g")
	if err != nil || len(offs) != 0 {
		t.Fatalf("a refused commit stored %v (%v)", offs, err)
	}

	// The offsets stream is the coordinator's alone.
	prod := kmsg.NewPtrProduceRequest()
	prod.Acks, prod.TimeoutMillis = -1, 10000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = groups.DefaultOffsetsStream
	pt.Partitions = []kmsg.ProduceRequestTopicPartition{{Partition: 0, Records: encodeTestBatch(-1, -1, [][]byte{[]byte("x")}, nil)}}
	prod.Topics = []kmsg.ProduceRequestTopic{pt}
	if r, err := prod.RequestWith(ctx, cl); err != nil || r.Topics[0].Partitions[0].ErrorCode != kerr.InvalidTopicException.Code {
		t.Fatalf("produce to the offsets stream: %+v %v", r, err)
	}
	del := kmsg.NewPtrDeleteTopicsRequest()
	del.TopicNames = []string{groups.DefaultOffsetsStream}
	if r, err := del.RequestWith(ctx, cl); err != nil || r.Topics[0].ErrorCode != kerr.InvalidTopicException.Code {
		t.Fatalf("delete of the offsets stream: %+v %v", r, err)
	}

	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorType, fc.CoordinatorKeys = 1, []string{"txn"}
	if r, err := fc.RequestWith(ctx, cl); err != nil || len(r.Coordinators) != 1 || r.Coordinators[0].ErrorCode != kerr.CoordinatorNotAvailable.Code {
		t.Fatalf("transaction coordinator: %+v %v", r, err)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
