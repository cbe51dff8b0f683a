//go:build e2e

package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"maps"
	"net"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/ingest/groups"
)

// kafkaStream has a Kafka listener on two ingestion pods, and a user that
// may produce and consume.
// kafkaNamespace is the namespace of the specs' Stream.
var kafkaNamespace string

const (
	kafkaStream     = "kevents"
	kafkaPartitions = 6
	kafkaUser       = "app"
)

var _ = Describe("A Stream with a Kafka listener", Ordered, func() {
	var (
		ns     string
		dialer *brokerDialer
	)

	BeforeAll(func() {
		ns = newNamespace("e2e-kafka")
		kafkaNamespace = ns
		sarama.Logger = log.New(GinkgoWriter, "[sarama] ", log.LstdFlags)
		manifest := fmt.Sprintf(`apiVersion: streams.catena.io/v1alpha1
kind: Stream
metadata:
  name: %s
spec:
  partitions: %d
  replicationFactor: 3
  replicas: 3
  storage: {size: 1Gi, storageClassName: catena-local}
  placement: {nodeSpread: None, zoneSpread: None}
  volumeReclaimPolicy: Delete
  ingestion:
    replicas: 2
    kafka: {enabled: true}
  access:
    users:
    - name: %s
      operations: [Produce, Consume]
`, kafkaStream, kafkaPartitions, kafkaUser)
		out, err := kubectlApply(ns, manifest)
		Expect(err).NotTo(HaveOccurred(), out)
	})

	It("becomes Ready with its groups Stream, and advertises its bootstrap address", func() {
		start := time.Now()
		expectStreamReady(ns, kafkaStream, kafkaPartitions, 5*time.Minute)
		expectStreamReady(ns, kafkaStream+"-groups", 1, 3*time.Minute)
		var s streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: kafkaStream}, &s)).To(Succeed())
		Expect(s.Status.Endpoints.Kafka).To(Equal(fmt.Sprintf("%s.%s.svc:9092", kafkaStream, ns)))
		GinkgoWriter.Printf("timing: Stream and groups Stream Ready %s after they were applied\n", since(start))
		dialer = newBrokerDialer(ns, kafkaStream, kafkaUser)
	})

	It("runs a franz-go consumer group through a member kill and the loss of its coordinator pod, skipping no record", func() {
		seeds := dialer.seeds()
		Expect(seeds).To(HaveLen(2), "one broker per ingestion pod")
		newClient := func(opts ...kgo.Opt) *kgo.Client {
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.Dialer(dialer.dial), kgo.RetryTimeout(time.Minute)}, opts...)...)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(cl.Close)
			return cl
		}

		By("listing each ingestion pod as a broker under its name")
		adm := kadm.NewClient(newClient())
		// A pod counts another once the headless Service lists it and its
		// next resolution (every 2 s) sees it: moments after both are
		// ready.
		Eventually(func(g Gomega) {
			brokers, err := adm.ListBrokers(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(brokers).To(HaveLen(2))
			for _, b := range brokers {
				g.Expect(b.Host).To(HaveSuffix(fmt.Sprintf(".%s-kafka.%s.svc", kafkaStream, ns)))
			}
		}).WithTimeout(time.Minute).Should(Succeed())

		By("producing idempotently, with headers, and reading the headers back")
		producer := newClient(kgo.RecordPartitioner(kgo.ManualPartitioner()))
		produce := func(round int) []string {
			var recs []*kgo.Record
			for p := range kafkaPartitions {
				for i := range 40 {
					recs = append(recs, &kgo.Record{Topic: kafkaStream, Partition: int32(p), Value: fmt.Appendf(nil, "r%d-p%d-%d", round, p, i),
						Headers: []kgo.RecordHeader{{Key: "round", Value: fmt.Appendf(nil, "%d", round)}}})
				}
			}
			pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			var keys []string
			for _, r := range producer.ProduceSync(pctx, recs...) {
				Expect(r.Err).NotTo(HaveOccurred())
				keys = append(keys, fmt.Sprintf("%d/%d", r.Record.Partition, r.Record.Offset))
			}
			return keys
		}
		all := produce(0)
		reader := newClient(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{kafkaStream: {0: kgo.NewOffset().AtStart()}}))
		fctx, cancel := context.WithTimeout(ctx, time.Minute)
		fs := reader.PollFetches(fctx)
		cancel()
		Expect(fs.Errors()).To(BeEmpty())
		Expect(fs.Records()).NotTo(BeEmpty())
		Expect(fs.Records()[0].Headers).To(Equal([]kgo.RecordHeader{{Key: "round", Value: []byte("0")}}))

		By("running a group of three")
		const group = "e2e-group"
		var members []*kafkaMember
		for i := range 3 {
			members = append(members, startKafkaMember(newClient, dialer, fmt.Sprintf("m%d", i), group))
		}
		read := func(ms ...*kafkaMember) map[string]bool {
			out := map[string]bool{}
			for _, m := range ms {
				m.mu.Lock()
				for k := range m.consumed {
					out[k] = true
				}
				m.mu.Unlock()
			}
			return out
		}
		// readAll: ms read every record of keys, but those extra committed.
		readAll := func(ms []*kafkaMember, keys []string, extra *kafkaMember) func(Gomega) {
			return func(g Gomega) {
				got := read(ms...)
				var committed map[string]bool
				if extra != nil {
					extra.mu.Lock()
					committed = maps.Clone(extra.committed)
					extra.mu.Unlock()
				}
				var missing []string
				for _, k := range keys {
					if !got[k] && !committed[k] {
						missing = append(missing, k)
					}
				}
				g.Expect(missing).To(BeEmpty(), "records no member read")
			}
		}
		Eventually(readAll(members, all, nil)).WithTimeout(2 * time.Minute).Should(Succeed())
		Eventually(func(g Gomega) {
			d, err := adm.DescribeGroups(ctx, group)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(d[group].State).To(Equal("Stable"))
			g.Expect(d[group].Members).To(HaveLen(3))
		}).WithTimeout(time.Minute).Should(Succeed())

		By("killing a member after it read records it never commits")
		victim := members[2]
		victim.mu.Lock()
		victim.noCommit = true
		readBefore := len(victim.consumed)
		victim.mu.Unlock()
		all = append(all, produce(1)...)
		Eventually(func() int { return len(read(victim)) }).WithTimeout(time.Minute).Should(BeNumerically(">", readBefore))
		// Killed: what it committed (a commit under way when it was told
		// to stop committing included) is final.
		victim.kill()

		By("deleting the ingestion pod that coordinates the group")
		d, err := adm.DescribeGroups(ctx, group)
		Expect(err).NotTo(HaveOccurred())
		coordinator := dialer.podOf(d[group].Coordinator.Host)
		Expect(coordinator).NotTo(BeEmpty(), "coordinator %s is no ingestion pod", d[group].Coordinator.Host)
		GinkgoWriter.Printf("deleting coordinator pod %s (%s)\n", coordinator, d[group].Coordinator.Host)
		Expect(k8s.Delete(ctx, podRef(ns, coordinator), client.GracePeriodSeconds(0))).To(Succeed())
		all = append(all, produce(2)...)

		survivors := members[:2]
		Eventually(readAll(survivors, all, victim)).WithTimeout(3*time.Minute).Should(Succeed(),
			"the survivors read every record the victim did not commit")

		By("committing every partition to its end under the group's retention hold")
		adm2 := kadm.NewClient(newClient(kgo.SeedBrokers(dialer.seeds()...)))
		Eventually(func(g Gomega) {
			offs, err := adm2.FetchOffsets(ctx, group)
			g.Expect(err).NotTo(HaveOccurred())
			for p := range kafkaPartitions {
				o, ok := offs.Lookup(kafkaStream, int32(p))
				g.Expect(ok).To(BeTrue())
				g.Expect(o.At).To(BeEquivalentTo(120), "partition %d", p)
			}
			dd, err := adm2.DescribeGroups(ctx, group)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(dd[group].Members).To(HaveLen(2))
		}).WithTimeout(2 * time.Minute).Should(Succeed())
		var s streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: kafkaStream}, &s)).To(Succeed())
		// A hold is moved after the commit's record is stored, so a
		// coordinator lost in between can leave one behind; the new
		// coordinator reasserts the holds it gains (after its load, and
		// every minute): every partition ends held at 120.
		held := regexp.MustCompile(`(?m)^\d+\s+` + regexp.QuoteMeta(groups.HoldName(group)) + `\s+(\d+)\s`)
		attempt := 0
		Eventually(func(g Gomega) {
			attempt++
			out, phase := runPodToEnd(ns, fmt.Sprintf("group-holds-%d", attempt), clientSecret(kafkaStream, kafkaUser),
				"--server", s.Status.Endpoints.Producers, "consumers", "list", "--stream", kafkaStream)
			g.Expect(phase).To(Equal(corev1.PodSucceeded), "catenactl consumers list:\n%s", out)
			holds := held.FindAllStringSubmatch(out, -1)
			g.Expect(holds).To(HaveLen(kafkaPartitions), "every partition held by the group:\n%s", out)
			for _, h := range holds {
				g.Expect(strconv.Atoi(h[1])).To(BeEquivalentTo(120), "a hold not at the committed offset:\n%s", out)
			}
		}).WithTimeout(3 * time.Minute).WithPolling(15 * time.Second).Should(Succeed())
	})

	// Seen to fail once (in the first 14 runs, with an earlier build): the
	// survivor given the killed member's partitions in the new generation
	// never read them, and no later generation came. Every sarama path
	// that fails a claim ends the session (a new generation), so sarama
	// was waiting somewhere; were it to happen again, the failure names
	// each member's generations and claims, the group as the coordinator
	// has it, and the stacks of sarama's goroutines.
	It("runs a sarama producer and consumer group through a member kill, skipping no record", func() {
		newConfig := func() *sarama.Config {
			cfg := sarama.NewConfig()
			cfg.Version = sarama.V2_8_0_0
			cfg.Net.TLS.Enable, cfg.Net.TLS.Config = true, dialer.tls.Clone()
			cfg.Producer.RequiredAcks = sarama.WaitForAll
			cfg.Producer.Return.Successes = true
			cfg.Producer.Idempotent, cfg.Net.MaxOpenRequests = true, 1
			cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
			cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
			cfg.Consumer.Group.Session.Timeout = 10 * time.Second
			cfg.Consumer.Group.Heartbeat.Interval = time.Second
			cfg.Consumer.MaxWaitTime = 500 * time.Millisecond
			return cfg
		}
		seeds := dialer.seeds()
		pcfg := newConfig()
		pd := &cutProxy{d: dialer}
		pcfg.Net.Proxy.Enable, pcfg.Net.Proxy.Dialer = true, pd
		prod, err := sarama.NewSyncProducer(seeds, pcfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(prod.Close)
		const topic = kafkaStream
		var all []string
		produce := func(n int) {
			var msgs []*sarama.ProducerMessage
			for i := range n {
				msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("k%d", i)), Value: sarama.StringEncoder(fmt.Sprintf("sarama-%d", i))})
			}
			Expect(prod.SendMessages(msgs)).To(Succeed())
			for _, m := range msgs {
				all = append(all, fmt.Sprintf("%d/%d", m.Partition, m.Offset))
			}
		}
		produce(300)

		const group = "e2e-sarama"
		var members []*saramaMember
		for i := range 3 {
			cfg := newConfig()
			cfg.ClientID = fmt.Sprintf("sarama-%d", i)
			m := &saramaMember{proxy: &cutProxy{d: dialer}, done: make(chan struct{}), consumed: map[string]bool{}}
			cfg.Net.Proxy.Enable, cfg.Net.Proxy.Dialer = true, m.proxy
			m.group, err = sarama.NewConsumerGroup(seeds, group, cfg)
			Expect(err).NotTo(HaveOccurred())
			mctx, cancel := context.WithCancel(ctx)
			m.cancel = cancel
			go func() {
				defer close(m.done)
				for mctx.Err() == nil {
					_ = m.group.Consume(mctx, []string{topic}, m)
				}
			}()
			DeferCleanup(func() {
				cancel()
				<-m.done
				m.group.Close()
			})
			members = append(members, m)
		}
		// Records of the earlier spec are in the stream too: the group
		// starts at the oldest, so it reads them as well.
		covers := func(sets ...map[string]bool) func(Gomega) {
			return func(g Gomega) {
				var missing []string
				for _, k := range all {
					found := false
					for _, s := range sets {
						found = found || s[k]
					}
					if !found {
						missing = append(missing, k)
					}
				}
				g.Expect(missing).To(BeEmpty(), "records no member read")
			}
		}
		Eventually(func(g Gomega) {
			covers(members[0].read(), members[1].read(), members[2].read())(g)
			for _, m := range members {
				g.Expect(m.read()).NotTo(BeEmpty(), "a member with no partitions")
			}
		}).WithTimeout(2 * time.Minute).Should(Succeed())

		victim := members[2]
		victim.mu.Lock()
		victim.noCommit = true
		victim.mu.Unlock()
		readByVictim := victim.read() // committed by sarama's auto-commit, or read again
		produce(300)
		Eventually(func() int { return len(victim.read()) }).WithTimeout(time.Minute).Should(BeNumerically(">", len(readByVictim)))
		victim.proxy.cut()
		victim.cancel()
		produce(300)
		Eventually(func(g Gomega) {
			covers(members[0].read(), members[1].read(), readByVictim)(g)
		}).WithTimeout(3*time.Minute).Should(Succeed(), func() string {
			var told []string
			for i, m := range members {
				m.mu.Lock()
				told = append(told, fmt.Sprintf("member %d: %s", i, strings.Join(m.sessions, "; ")))
				m.mu.Unlock()
			}
			return "the survivors read every record the victim did not commit; the group: " + describeGroup(group) +
				"\nwhat sarama told the members:\n" + strings.Join(told, "\n") +
				"\nsarama's goroutines:\n" + saramaGoroutines()
		})
	})
})

// describeGroup is what a new franz-go admin client sees of group: its
// members' partitions and its committed offsets, for a failure's message.
func describeGroup(group string) string {
	d := newBrokerDialer(kafkaNamespace, kafkaStream, kafkaUser)
	cl, err := kgo.NewClient(kgo.SeedBrokers(d.seeds()...), kgo.Dialer(d.dial))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	dg, err := adm.DescribeGroups(ctx, group)
	offs, ferr := adm.FetchOffsets(ctx, group)
	ends, eerr := adm.ListEndOffsets(ctx, kafkaStream)
	var b strings.Builder
	fmt.Fprintf(&b, "described %+v (%v)\n", dg[group], err)
	for _, m := range dg[group].Members {
		a, _ := m.Assigned.AsConsumer()
		fmt.Fprintf(&b, "member %s: %+v\n", m.ClientID, a)
	}
	fmt.Fprintf(&b, "committed (%v):", ferr)
	offs.Each(func(o kadm.OffsetResponse) { fmt.Fprintf(&b, " %d@%d", o.Partition, o.At) })
	fmt.Fprintf(&b, "\nends (%v):", eerr)
	ends.Each(func(o kadm.ListedOffset) { fmt.Fprintf(&b, " %d@%d", o.Partition, o.Offset) })
	return b.String()
}

// saramaGoroutines is the stacks of the goroutines running sarama's code,
// for a failure's message: where a member waits that reads nothing.
func saramaGoroutines() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	var out []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "IBM/sarama") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// cutProxy is sarama's dialer to the brokers (sarama does the TLS); cut
// closes every connection it made and refuses new ones, as a dead
// process's.
type cutProxy struct {
	d     *brokerDialer
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

func (p *cutProxy) Dial(network, addr string) (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		return nil, errors.New("killed")
	}
	c, err := p.d.rawDial(ctx, network, addr)
	if err == nil {
		p.conns = append(p.conns, c)
	}
	return c, err
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = true
	for _, c := range p.conns {
		c.Close()
	}
}

// saramaMember is a sarama member of a group: it marks what it reads
// (sarama's auto-commit commits it) unless told not to.
type saramaMember struct {
	proxy    *cutProxy
	group    sarama.ConsumerGroup
	cancel   context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	consumed map[string]bool
	noCommit bool
	// sessions is what sarama told it of each generation, for a
	// failure's message.
	sessions []string
}

func (m *saramaMember) Setup(sess sarama.ConsumerGroupSession) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sessions = append(m.sessions, fmt.Sprintf("generation %d claims %v", sess.GenerationID(), sess.Claims()))
	return nil
}
func (m *saramaMember) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (m *saramaMember) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	m.mu.Lock()
	m.sessions = append(m.sessions, fmt.Sprintf("generation %d consumes %d from %d", sess.GenerationID(), claim.Partition(), claim.InitialOffset()))
	m.mu.Unlock()
	for msg := range claim.Messages() {
		m.mu.Lock()
		m.consumed[fmt.Sprintf("%d/%d", msg.Partition, msg.Offset)] = true
		noCommit := m.noCommit
		m.mu.Unlock()
		if !noCommit {
			sess.MarkMessage(msg, "")
		}
	}
	return nil
}

func (m *saramaMember) read() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.consumed)
}

func podRef(ns, name string) *corev1.Pod {
	p := &corev1.Pod{}
	p.Namespace, p.Name = ns, name
	return p
}

// brokerDialer reaches the brokers of a Stream's Kafka listener from this
// machine, which routes to pods but does not resolve the cluster's names:
// a broker's name is its pod's IP with dashes, under the Stream's brokers
// Service, so the dialer reads the address from the name and checks the
// certificate against the name.
type brokerDialer struct {
	ns, stream string
	tls        *tls.Config
}

func newBrokerDialer(ns, stream, user string) *brokerDialer {
	var s corev1.Secret
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: clientSecret(stream, user)}, &s)).To(Succeed())
	roots := x509.NewCertPool()
	Expect(roots.AppendCertsFromPEM(s.Data["ca.crt"])).To(BeTrue())
	pair, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	Expect(err).NotTo(HaveOccurred())
	return &brokerDialer{ns: ns, stream: stream, tls: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, Certificates: []tls.Certificate{pair}}}
}

func (d *brokerDialer) domain() string { return fmt.Sprintf(".%s-kafka.%s.svc", d.stream, d.ns) }

// seeds are the broker names of the ready ingestion pods.
func (d *brokerDialer) seeds() []string {
	var out []string
	Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k8s.List(ctx, &pods, client.InNamespace(d.ns), client.MatchingLabels{
			"app.kubernetes.io/component": "ingest", "app.kubernetes.io/instance": d.stream})).To(Succeed())
		out = nil
		for _, p := range pods.Items {
			if podReady(p) && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
				out = append(out, net.JoinHostPort(strings.ReplaceAll(p.Status.PodIP, ".", "-")+d.domain(), "9092"))
			}
		}
		g.Expect(out).To(HaveLen(2))
	}).WithTimeout(3 * time.Minute).Should(Succeed())
	return out
}

// podOf is the ingestion pod a broker name stands for.
func (d *brokerDialer) podOf(host string) string {
	ip := strings.ReplaceAll(strings.TrimSuffix(host, d.domain()), "-", ".")
	var pods corev1.PodList
	Expect(k8s.List(ctx, &pods, client.InNamespace(d.ns), client.MatchingLabels{"app.kubernetes.io/component": "ingest", "app.kubernetes.io/instance": d.stream})).To(Succeed())
	for _, p := range pods.Items {
		if p.Status.PodIP == ip {
			return p.Name
		}
	}
	return ""
}

// rawDial connects to the pod a broker name stands for, without TLS.
func (d *brokerDialer) rawDial(ctx context.Context, network, hostport string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(host, d.domain()) {
		return nil, fmt.Errorf("broker %s is not named under %s", host, d.domain())
	}
	ip := strings.ReplaceAll(strings.TrimSuffix(host, d.domain()), "-", ".")
	return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, net.JoinHostPort(ip, port))
}

// dial connects to a broker over TLS, checking its certificate against its
// name.
func (d *brokerDialer) dial(ctx context.Context, network, hostport string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	raw, err := d.rawDial(ctx, network, hostport)
	if err != nil {
		return nil, err
	}
	cfg := d.tls.Clone()
	cfg.ServerName = host
	conn := tls.Client(raw, cfg)
	if err := conn.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return conn, nil
}

// kafkaMember is a franz-go member of a group: it reads, then commits
// what it read, unless told not to; kill cuts its connections as a dead
// process's are (no LeaveGroup).
type kafkaMember struct {
	cl        *kgo.Client
	cancel    context.CancelFunc
	done      chan struct{}
	mu        sync.Mutex
	conns     []net.Conn
	dead      bool
	noCommit  bool
	consumed  map[string]bool
	committed map[string]bool
}

func startKafkaMember(newClient func(...kgo.Opt) *kgo.Client, d *brokerDialer, name, group string) *kafkaMember {
	m := &kafkaMember{done: make(chan struct{}), consumed: map[string]bool{}, committed: map[string]bool{}}
	dial := func(ctx context.Context, network, host string) (net.Conn, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.dead {
			return nil, errors.New("killed")
		}
		c, err := d.dial(ctx, network, host)
		if err == nil {
			m.conns = append(m.conns, c)
		}
		return c, err
	}
	m.cl = newClient(kgo.Dialer(dial), kgo.ClientID(name), kgo.ConsumerGroup(group), kgo.ConsumeTopics(kafkaStream),
		kgo.Balancers(kgo.RangeBalancer()), kgo.DisableAutoCommit(), kgo.SessionTimeout(10*time.Second),
		kgo.HeartbeatInterval(time.Second), kgo.FetchMaxWait(500*time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	cctx, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	DeferCleanup(func() {
		cancel()
		<-m.done
	})
	go func() {
		defer close(m.done)
		defer GinkgoRecover()
		for cctx.Err() == nil {
			recs := m.cl.PollFetches(cctx).Records()
			m.mu.Lock()
			for _, r := range recs {
				m.consumed[fmt.Sprintf("%d/%d", r.Partition, r.Offset)] = true
			}
			noCommit := m.noCommit
			m.mu.Unlock()
			if len(recs) == 0 || noCommit {
				continue
			}
			if err := m.cl.CommitRecords(cctx, recs...); err != nil {
				continue
			}
			m.mu.Lock()
			for _, r := range recs {
				m.committed[fmt.Sprintf("%d/%d", r.Partition, r.Offset)] = true
			}
			m.mu.Unlock()
		}
	}()
	return m
}

func (m *kafkaMember) kill() {
	m.mu.Lock()
	m.dead = true
	for _, c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	m.cancel()
	<-m.done
}
