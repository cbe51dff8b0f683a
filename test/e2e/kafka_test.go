//go:build e2e

package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"strings"
	"sync"
	"time"

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
		brokers, err := adm.ListBrokers(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(brokers).To(HaveLen(2))
		for _, b := range brokers {
			Expect(b.Host).To(HaveSuffix(fmt.Sprintf(".%s-kafka.%s.svc", kafkaStream, ns)))
		}

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
		out := runPod(ns, "group-holds", clientSecret(kafkaStream, kafkaUser),
			"--server", s.Status.Endpoints.Producers, "consumers", "list", "--stream", kafkaStream)
		held := regexp.MustCompile(`(?m)^\d+\s+` + regexp.QuoteMeta(groups.HoldName(group)) + `\s+120\s`)
		Expect(held.FindAllString(out, -1)).To(HaveLen(kafkaPartitions), "every partition held at its end by the group:\n%s", out)
	})
})

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

func (d *brokerDialer) dial(ctx context.Context, network, hostport string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(host, d.domain()) {
		return nil, fmt.Errorf("broker %s is not named under %s", host, d.domain())
	}
	ip := strings.ReplaceAll(strings.TrimSuffix(host, d.domain()), "-", ".")
	raw, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, net.JoinHostPort(ip, port))
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
