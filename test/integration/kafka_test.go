package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kafkaRec is a record as a Kafka client acknowledged or read it.
type kafkaRec struct {
	partition int32
	offset    int64
	key, val  string
}

// TestKafkaClientsAgainstDev: unchanged Kafka clients no one here wrote
// (franz-go, and Debian's kcat on librdkafka) create a topic, produce to it
// idempotently with compression, and after a kill -9 of every process of
// catena dev and a restart read back every acknowledged record exactly
// once, at its offset, whichever client wrote it; the topic is deleted.
func TestKafkaClientsAgainstDev(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed (apt-get install kcat; .ci/run installs it)")
	}
	dir := t.TempDir()
	kafkaAddr := freeAddr(t)
	d := startDev(t, dir, "--stream", "demo:1", "--kafka-listen", kafkaAddr)
	if d.state.Kafka != kafkaAddr {
		t.Fatalf("dev.json names Kafka listener %q, want %q", d.state.Kafka, kafkaAddr)
	}
	ctx := ctxT(t, 3*time.Minute)
	admin, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	create := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = "orders", 3, -1
	create.Topics = append(create.Topics, ct)
	create.TimeoutMillis = 30000
	cr, err := create.RequestWith(ctx, admin)
	if err != nil || cr.Topics[0].ErrorCode != 0 {
		t.Fatalf("CreateTopics orders: %v %+v", err, cr)
	}
	// Again: exists, and nothing changes.
	if cr, err = create.RequestWith(ctx, admin); err != nil || cr.Topics[0].ErrorCode == 0 {
		t.Fatalf("CreateTopics of an existing topic: %v %+v", err, cr)
	}

	// franz-go: idempotent (its default), acks=all, zstd.
	var mu sync.Mutex
	var acked []kafkaRec
	prod, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.DefaultProduceTopic("orders"), kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 600 {
		wg.Add(1)
		prod.Produce(ctx, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i%50), Value: fmt.Appendf(nil, "kgo-%d", i)}, func(r *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("franz-go record %s: %v", r.Value, err)
				return
			}
			mu.Lock()
			acked = append(acked, kafkaRec{r.Partition, r.Offset, string(r.Key), string(r.Value)})
			mu.Unlock()
		})
	}
	wg.Wait()
	prod.Close()

	// kcat: idempotent, lz4, keyed lines. It exits non-zero when a
	// delivery fails; its delivery reports give each record's offset.
	var in bytes.Buffer
	for i := range 300 {
		fmt.Fprintf(&in, "c%d:kcat-%d\n", i%40, i)
	}
	cmd := exec.CommandContext(ctx, kcat, "-b", kafkaAddr, "-t", "orders", "-P", "-K:", "-X", "enable.idempotence=true", "-X", "compression.codec=lz4", "-X", "acks=all")
	cmd.Stdin = &in
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kcat produce: %v\n%s", err, out)
	}

	// A consumer group reads part of the topic and commits what it read;
	// its committed offsets must survive the kill -9 below.
	committed := groupReadAndCommit(ctx, t, kafkaAddr, "readers", 450)

	// Every process of dev killed, then dev again on the same volumes.
	d.kill9All()
	d = startDev(t, dir, "--stream", "demo:1", "--kafka-listen", kafkaAddr)

	// The group's offsets came back from the offsets stream, and a member
	// of the group resumes from them: it reads exactly the rest.
	groupResumes(ctx, t, kafkaAddr, "readers", committed, 900)

	// kcat reads everything back: franz-go's records at their
	// acknowledged offsets, and kcat's own 300.
	cmd = exec.CommandContext(ctx, kcat, "-b", kafkaAddr, "-t", "orders", "-C", "-o", "beginning", "-e", "-q", "-f", "%p %o %k %s\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat consume: %v\n%s", err, out)
	}
	read := map[[2]int64]kafkaRec{}
	kcatRecs := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("kcat printed %q", line)
		}
		p, _ := strconv.Atoi(f[0])
		o, _ := strconv.ParseInt(f[1], 10, 64)
		k := [2]int64{int64(p), o}
		if _, dup := read[k]; dup {
			t.Errorf("partition %d offset %d read twice", p, o)
		}
		read[k] = kafkaRec{int32(p), o, f[2], f[3]}
		if strings.HasPrefix(f[3], "kcat-") {
			if kcatRecs[f[3]] {
				t.Errorf("%s stored twice", f[3])
			}
			kcatRecs[f[3]] = true
		}
	}
	if len(kcatRecs) != 300 {
		t.Errorf("read %d of kcat's 300 records", len(kcatRecs))
	}
	if len(acked) != 600 {
		t.Errorf("franz-go had %d of 600 records acknowledged", len(acked))
	}
	for _, a := range acked {
		got, ok := read[[2]int64{int64(a.partition), a.offset}]
		if !ok || got != a {
			t.Errorf("acknowledged %+v, read %+v (found %v)", a, got, ok)
		}
	}
	if len(read) != 900 {
		t.Errorf("read %d records, 900 were produced", len(read))
	}

	// franz-go reads the same, from a fresh client after the restart.
	cons, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	seen := 0
	for seen < 900 && ctx.Err() == nil {
		fs := cons.PollFetches(ctx)
		fs.EachError(func(tp string, p int32, err error) { t.Errorf("franz-go fetch %s/%d: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			seen++
			if want := read[[2]int64{int64(r.Partition), r.Offset}]; want.val != string(r.Value) || want.key != string(r.Key) {
				t.Errorf("franz-go read %s=%s at %d/%d, kcat %s=%s", r.Key, r.Value, r.Partition, r.Offset, want.key, want.val)
			}
		})
	}
	if seen != 900 {
		t.Fatalf("franz-go read %d of 900 records", seen)
	}

	del := kmsg.NewPtrDeleteTopicsRequest()
	del.TopicNames = []string{"orders"}
	del.TimeoutMillis = 30000
	if dr, err := del.RequestWith(context.Background(), admin); err != nil || dr.Topics[0].ErrorCode != 0 {
		t.Fatalf("DeleteTopics: %v %+v", err, dr)
	}
	eventually(t, 20*time.Second, func() error {
		names, err := d.client.ListStreams(ctxT(t, 5*time.Second))
		if err != nil {
			return err
		}
		for _, n := range names {
			if n == "orders" {
				return fmt.Errorf("stream orders still listed: %v", names)
			}
		}
		return nil
	})
}

// TestSaramaAgainstDev: a second independent client, IBM's sarama (the
// Java client's habits: it bumps its producer epoch itself), produces
// idempotently with snappy and reads every acknowledged record back once,
// at its offset.
func TestSaramaAgainstDev(t *testing.T) {
	dir := t.TempDir()
	kafkaAddr := freeAddr(t)
	startDev(t, dir, "--stream", "demo:3", "--kafka-listen", kafkaAddr)
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Compression = sarama.CompressionSnappy
	cfg.Producer.Retry.Max = 10
	cfg.Net.MaxOpenRequests = 1
	cfg.Consumer.Return.Errors = true
	prod, err := sarama.NewSyncProducer([]string{kafkaAddr}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	type at struct {
		p int32
		o int64
	}
	acked := map[at]string{}
	for i := range 300 {
		msgs := []*sarama.ProducerMessage{}
		for j := range 3 {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: "demo", Key: sarama.StringEncoder(fmt.Sprintf("s%d", (i+j)%20)), Value: sarama.StringEncoder(fmt.Sprintf("sarama-%d-%d", i, j))})
		}
		if err := prod.SendMessages(msgs); err != nil {
			t.Fatalf("sarama produce: %v", err)
		}
		for _, m := range msgs {
			k := at{m.Partition, m.Offset}
			if _, dup := acked[k]; dup {
				t.Fatalf("two records acknowledged at %d/%d", m.Partition, m.Offset)
			}
			v, _ := m.Value.Encode()
			acked[k] = string(v)
		}
	}
	cons, err := sarama.NewConsumer([]string{kafkaAddr}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	read := map[at]string{}
	for p := range int32(3) {
		pc, err := cons.ConsumePartition("demo", p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		hw := pc.HighWaterMarkOffset()
		timeout := time.After(60 * time.Second)
		for hw > 0 {
			var m *sarama.ConsumerMessage
			select {
			case m = <-pc.Messages():
			case err := <-pc.Errors():
				t.Fatalf("sarama consume %d: %v", p, err)
			case <-timeout:
				t.Fatalf("partition %d: read up to %d of %d", p, len(read), hw)
			}
			k := at{m.Partition, m.Offset}
			if _, dup := read[k]; dup {
				t.Fatalf("read %d/%d twice", m.Partition, m.Offset)
			}
			read[k] = string(m.Value)
			if m.Offset+1 >= pc.HighWaterMarkOffset() {
				break
			}
		}
		pc.Close()
	}
	if len(read) != 900 || len(acked) != 900 {
		t.Fatalf("read %d records, %d acknowledged, 900 produced", len(read), len(acked))
	}
	for k, v := range acked {
		if read[k] != v {
			t.Errorf("acknowledged %s at %d/%d, read %q", v, k.p, k.o, read[k])
		}
	}
}

// groupReadAndCommit runs one franz-go member of group on "orders" until
// it has read at least n records, committing each batch it read, then
// leaves; it returns the group's committed offsets as the listener
// reports them.
func groupReadAndCommit(ctx context.Context, t *testing.T, addr, group string, n int) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup(group), kgo.ConsumeTopics("orders"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	read := 0
	for read < n && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(tp string, p int32, err error) { t.Errorf("group fetch %s/%d: %v", tp, p, err) })
		recs := fs.Records()
		if len(recs) == 0 {
			continue
		}
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			t.Fatalf("commit: %v", err)
		}
		read += len(recs)
	}
	cl.Close()
	adm, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	offs, err := kadm.NewClient(adm).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	total := int64(0)
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Err != nil {
			t.Fatalf("committed offset of %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		out[o.Partition] = o.At
		total += o.At
	})
	if total < int64(n) {
		t.Fatalf("group %s committed %v (%d records), read %d", group, out, total, read)
	}
	return out
}

// groupResumes checks that group's committed offsets are committed, and
// that a new member of it reads every record of "orders" from them on
// (total in all) and none before.
func groupResumes(ctx context.Context, t *testing.T, addr, group string, committed map[int32]int64, total int) {
	t.Helper()
	adm, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	var offs kadm.OffsetResponses
	// The listener loads the offsets stream once its chains are known.
	eventually(t, 30*time.Second, func() error {
		offs, err = kadm.NewClient(adm).FetchOffsets(ctx, group)
		return err
	})
	rest := total
	for p, at := range committed {
		o, ok := offs.Lookup("orders", p)
		if !ok || o.Err != nil || o.At != at {
			t.Fatalf("after the restart partition %d is committed at %+v, want %d", p, o, at)
		}
		rest -= int(at)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup(group), kgo.ConsumeTopics("orders"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := map[[2]int64]bool{}
	for len(seen) < rest && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			k := [2]int64{int64(r.Partition), r.Offset}
			if r.Offset < committed[r.Partition] {
				t.Fatalf("the group read %d/%d, before its committed offset %d", r.Partition, r.Offset, committed[r.Partition])
			}
			if seen[k] {
				t.Fatalf("the group read %d/%d twice", r.Partition, r.Offset)
			}
			seen[k] = true
		})
	}
	if len(seen) != rest {
		t.Fatalf("the group read %d records after its commits, want %d", len(seen), rest)
	}
}

// cutDialer dials connections that can all be cut at once, as a killed
// process's are: its client sends nothing more, not even a LeaveGroup.
type cutDialer struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

func (d *cutDialer) Dial(network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, errors.New("killed")
	}
	c, err := net.Dial(network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cutDialer) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	for _, c := range d.conns {
		c.Close()
	}
}

// saramaMember is one sarama consumer-group member: it records what it
// reads and marks each message for sarama's auto-commit, unless it is
// told to stop (it is about to be killed).
type saramaMember struct {
	dialer   *cutDialer
	group    sarama.ConsumerGroup
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	consumed map[[2]int64]bool
	noCommit bool
}

func (m *saramaMember) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (m *saramaMember) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (m *saramaMember) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		m.mu.Lock()
		m.consumed[[2]int64{int64(msg.Partition), msg.Offset}] = true
		noCommit := m.noCommit
		m.mu.Unlock()
		if !noCommit {
			// Committed by sarama's auto-commit, every 100 ms.
			sess.MarkMessage(msg, "")
		}
	}
	return nil
}

func (m *saramaMember) read() map[[2]int64]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[[2]int64]bool, len(m.consumed))
	for k := range m.consumed {
		out[k] = true
	}
	return out
}

// TestSaramaConsumerGroupAgainstDev: three sarama members of a group
// (sarama's own range assignor); one is killed, its connections cut, after
// reading records it never commits. Once its session expires the two
// others take its partitions over from their committed offsets and read
// every record it did not commit: none is skipped.
func TestSaramaConsumerGroupAgainstDev(t *testing.T) {
	dir := t.TempDir()
	kafkaAddr := freeAddr(t)
	startDev(t, dir, "--stream", "demo:6", "--kafka-listen", kafkaAddr)
	ctx := ctxT(t, 3*time.Minute)
	newConfig := func() *sarama.Config {
		cfg := sarama.NewConfig()
		cfg.Version = sarama.V2_8_0_0
		cfg.Producer.RequiredAcks = sarama.WaitForAll
		cfg.Producer.Return.Successes = true
		cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
		cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
		cfg.Consumer.Group.Session.Timeout = 6 * time.Second
		cfg.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
		cfg.Consumer.MaxWaitTime = 200 * time.Millisecond
		return cfg
	}
	prod, err := sarama.NewSyncProducer([]string{kafkaAddr}, newConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var all [][2]int64
	produce := func(n int) {
		t.Helper()
		var msgs []*sarama.ProducerMessage
		for i := range n {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: "demo", Key: sarama.StringEncoder(fmt.Sprintf("k%d", i)), Value: sarama.StringEncoder(fmt.Sprintf("v%d", i))})
		}
		if err := prod.SendMessages(msgs); err != nil {
			t.Fatalf("sarama produce: %v", err)
		}
		for _, m := range msgs {
			all = append(all, [2]int64{int64(m.Partition), m.Offset})
		}
	}
	produce(300)

	var members []*saramaMember
	for i := range 3 {
		cfg := newConfig()
		cfg.ClientID = fmt.Sprintf("member-%d", i)
		m := &saramaMember{dialer: &cutDialer{}, done: make(chan struct{}), consumed: map[[2]int64]bool{}}
		cfg.Net.Proxy.Enable, cfg.Net.Proxy.Dialer = true, m.dialer
		if m.group, err = sarama.NewConsumerGroup([]string{kafkaAddr}, "sarama-readers", cfg); err != nil {
			t.Fatal(err)
		}
		mctx, cancel := context.WithCancel(ctx)
		m.cancel = cancel
		go func() {
			defer close(m.done)
			for mctx.Err() == nil {
				_ = m.group.Consume(mctx, []string{"demo"}, m)
			}
		}()
		members = append(members, m)
	}
	union := func(ms ...map[[2]int64]bool) map[[2]int64]bool {
		out := map[[2]int64]bool{}
		for _, m := range ms {
			for k := range m {
				out[k] = true
			}
		}
		return out
	}
	covers := func(got map[[2]int64]bool) error {
		missing := 0
		for _, k := range all {
			if !got[k] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d records not read", missing, len(all))
		}
		return nil
	}
	eventually(t, 60*time.Second, func() error {
		for i, m := range members {
			if len(m.read()) == 0 {
				return fmt.Errorf("member %d has read nothing", i)
			}
		}
		return covers(union(members[0].read(), members[1].read(), members[2].read()))
	})

	t.Logf("%s the group read the first 300 records", time.Now().Format("15:04:05.000"))
	// The victim reads on without committing, then is killed.
	victim := members[2]
	victim.mu.Lock()
	victim.noCommit = true
	victim.mu.Unlock()
	committedByVictim := victim.read()
	produce(300)
	eventually(t, 30*time.Second, func() error {
		if len(victim.read()) == len(committedByVictim) {
			return errors.New("the victim has read none of the new records")
		}
		return nil
	})
	victim.dialer.cut()
	victim.cancel()
	t.Logf("%s killed the victim", time.Now().Format("15:04:05.000"))
	produce(300)

	// What the victim read without committing, the survivors must read.
	eventually(t, 90*time.Second, func() error {
		return covers(union(members[0].read(), members[1].read(), committedByVictim))
	})
	t.Logf("%s the survivors read every record", time.Now().Format("15:04:05.000"))
	for _, m := range members[:2] {
		m.cancel()
		<-m.done
		m.group.Close()
	}
}
