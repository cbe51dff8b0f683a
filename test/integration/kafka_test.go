package integration

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
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

	// Every process of dev killed, then dev again on the same volumes.
	d.kill9All()
	d = startDev(t, dir, "--stream", "demo:1", "--kafka-listen", kafkaAddr)

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
