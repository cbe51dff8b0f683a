package envtest_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

var _ = Describe("Stream", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("accepts a Stream applied alone and applies the defaults", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "alone", `partitions: 3`))).To(Succeed())

		var s streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "alone"}, &s)).To(Succeed())
		Expect(s.Spec.ReplicationFactor).To(Equal(streamsv1alpha1.DefaultReplicationFactor))
		Expect(s.Spec.Durability.Mode).To(Equal(streamsv1alpha1.DefaultDurabilityMode))
		Expect(s.Spec.Ingestion.Replicas).To(Equal(streamsv1alpha1.DefaultIngestionReplicas))
		// The own-pool fields get no schema defaults: they must stay absent
		// for a Stream on a shared pool. The operator fills them.
		Expect(s.Spec.Replicas).To(BeNil())
		Expect(s.Spec.Storage).To(BeNil())
		Expect(s.HasOwnPool()).To(BeTrue())
		Expect(s.PoolName()).To(Equal("alone-pool"))
		pool := s.OwnPoolSpec()
		Expect(pool.Replicas).To(Equal(streamsv1alpha1.DefaultReplicas))
		Expect(pool.Storage.Size.Equal(resource.MustParse(streamsv1alpha1.DefaultStorageSize))).To(BeTrue())
	})

	It("accepts a Stream with the longest name", func() {
		name := "s" + strings.Repeat("x", streamsv1alpha1.MaxStreamNameLength-1)
		Expect(k8s.Create(ctx, manifest(ns, "Stream", name, `partitions: 1`))).To(Succeed())
	})

	It("accepts a Kafka listener on a Stream with the longest name it allows", func() {
		name := "k" + strings.Repeat("x", streamsv1alpha1.MaxStreamNameLength-len("-groups")-1)
		Expect(k8s.Create(ctx, manifest(ns, "Stream", name, "partitions: 1\ningestion: {kafka: {enabled: true}}"))).To(Succeed())
	})

	It("accepts a Stream on a shared pool and one with its own pool spelled out", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "shared", `
pool: common
partitions: 12
replicationFactor: 5
retention: {time: 720h, bytes: 50Gi}
segmentBytes: 64Mi
durability: {mode: Interval, fsyncInterval: 50ms}`))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "own", `
partitions: 4
replicationFactor: 5
replicas: 5
storage: {size: 20Gi, storageClassName: local-path}
resources: {requests: {cpu: 500m, memory: 1Gi}}
placement: {nodeSpread: Required, zoneSpread: None, nodeSelector: {disk: nvme}}`))).To(Succeed())
	})

	DescribeTable("accepts a segment size at its bounds, in any form of quantity",
		func(name, spec string) {
			Expect(k8s.Create(ctx, manifest(ns, "Stream", name, "partitions: 1\n"+spec))).To(Succeed())
		},
		Entry("the smallest", "seg-min", "segmentBytes: 1Mi"),
		Entry("the largest", "seg-max", "segmentBytes: 1Gi"),
		Entry("in bytes", "seg-plain", "segmentBytes: 1048576"),
		Entry("below retention's limits", "seg-retained", "segmentBytes: 8Mi\nretention: {bytes: 64Mi, hardBytes: 128Mi}"),
	)

	DescribeTable("rejects an invalid Stream",
		func(name, spec, message string) {
			s := manifest(ns, "Stream", name, spec)
			expectRejected(k8s.Create(ctx, s), message)
			expectAbsent(s)
		},
		Entry("zero partitions", "zero", `partitions: 0`,
			"spec.partitions in body should be greater than or equal to 1"),
		Entry("minimum chain length above the replication factor", "minlen", "partitions: 1\nreplicationFactor: 2\nminChainLength: 3",
			"minChainLength must not exceed replicationFactor"),
		Entry("minimum chain length of zero", "minzero", "partitions: 1\nminChainLength: 0",
			"spec.minChainLength in body should be greater than or equal to 1"),
		Entry("too many partitions", "many", `partitions: 1025`,
			"spec.partitions in body should be less than or equal to 1024"),
		Entry("no partitions", "none", `replicationFactor: 3`,
			"spec.partitions: Required value"),
		Entry("replicationFactor above its own replicas", "rf-replicas", "partitions: 3\nreplicationFactor: 4\nreplicas: 3",
			"replicationFactor must not exceed replicas (3 when omitted)"),
		Entry("replicationFactor above the default replicas", "rf-default", "partitions: 3\nreplicationFactor: 4",
			"replicationFactor must not exceed replicas (3 when omitted)"),
		Entry("replicationFactor zero", "rf-zero", "partitions: 3\nreplicationFactor: 0",
			"spec.replicationFactor in body should be greater than or equal to 1"),
		Entry("a shared pool and own pool fields", "both", "pool: common\npartitions: 3\nreplicas: 5",
			"omit them when pool names a shared ReplicaPool"),
		Entry("a shared pool and an own pool's catch-up rate", "both-rate", "pool: common\npartitions: 3\ncatchUpMiBPerSecond: 100",
			"omit them when pool names a shared ReplicaPool"),
		Entry("a shared pool and an own pool's journal", "both-journal", "pool: common\npartitions: 3\njournal: true",
			"omit them when pool names a shared ReplicaPool"),
		Entry("a storage size that is not a quantity", "bad-size", "partitions: 3\nstorage: {size: ten gigs}",
			"size must be a quantity of at least 1Gi, such as 10Gi or 500Gi"),
		Entry("a storage size below the minimum", "small-size", "partitions: 3\nstorage: {size: 100Mi}",
			"size must be a quantity of at least 1Gi, such as 10Gi or 500Gi"),
		Entry("a name too long for its own pool", "s"+strings.Repeat("x", streamsv1alpha1.MaxStreamNameLength), "partitions: 3",
			"Stream names must be at most 47 characters"),
		Entry("a name that cannot name a Service", "1st", "partitions: 3",
			"Stream names must start with a letter"),
		Entry("a retention time that is not a duration", "bad-time", "partitions: 3\nretention: {time: a week}",
			"time must be a duration such as 168h or 30m (units h, m, s, ms) of at least 1m"),
		Entry("a retention time in days", "days", "partitions: 3\nretention: {time: 7d}",
			"time must be a duration such as 168h or 30m (units h, m, s, ms) of at least 1m"),
		Entry("a retention time below a minute", "short-time", "partitions: 3\nretention: {time: 30s}",
			"time must be a duration such as 168h or 30m (units h, m, s, ms) of at least 1m"),
		Entry("retention bytes that are not a quantity", "bad-bytes", "partitions: 3\nretention: {bytes: lots}",
			"bytes must be a quantity of at least 1Mi, such as 512Mi or 50Gi"),
		Entry("a segment size below 1Mi", "small-segment", "partitions: 3\nsegmentBytes: 512Ki",
			"segmentBytes must be a quantity from 1Mi to 1Gi, such as 64Mi or 256Mi"),
		Entry("a segment size above 1Gi", "large-segment", "partitions: 3\nsegmentBytes: 2Gi",
			"segmentBytes must be a quantity from 1Mi to 1Gi, such as 64Mi or 256Mi"),
		Entry("a segment size that is not a quantity", "bad-segment", "partitions: 3\nsegmentBytes: big",
			"segmentBytes must be a quantity from 1Mi to 1Gi, such as 64Mi or 256Mi"),
		Entry("a segment size as large as retention's bytes", "segment-bytes", "partitions: 3\nsegmentBytes: 64Mi\nretention: {bytes: 64Mi}",
			"segmentBytes must be below retention's bytes and hardBytes"),
		Entry("a segment size above retention's hardBytes", "segment-hard", "partitions: 3\nsegmentBytes: 256Mi\nretention: {time: 1h, hardBytes: 128Mi}",
			"segmentBytes must be below retention's bytes and hardBytes"),
		Entry("an empty retention", "empty-retention", "partitions: 3\nretention: {}",
			"spec.retention in body should have at least 1 properties"),
		Entry("Interval durability without an interval", "no-interval", "partitions: 3\ndurability: {mode: Interval}",
			"fsyncInterval is required when mode is Interval and must be omitted otherwise"),
		Entry("an interval with Fsync durability", "stray-interval", "partitions: 3\ndurability: {fsyncInterval: 10ms}",
			"fsyncInterval is required when mode is Interval and must be omitted otherwise"),
		Entry("an fsync interval too long", "long-interval", "partitions: 3\ndurability: {mode: Interval, fsyncInterval: 1m}",
			"fsyncInterval must be a duration such as 10ms or 1s (units s, ms) from 1ms to 10s"),
		Entry("an unknown durability mode", "bad-mode", "partitions: 3\ndurability: {mode: Never}",
			`spec.durability.mode: Unsupported value: "Never"`),
		Entry("an external listener of type ClusterIP", "ext-cip", "partitions: 3\ningestion: {external: {type: ClusterIP}}",
			`spec.ingestion.external.type: Unsupported value: "ClusterIP"`),
		Entry("a node port for a load balancer", "ext-lb-port", "partitions: 3\ningestion: {external: {type: LoadBalancer, nodePort: 31000}}",
			"nodePort is only for type NodePort"),
		Entry("a node port outside the node port range", "ext-port", "partitions: 3\ningestion: {external: {type: NodePort, nodePort: 8080}}",
			"spec.ingestion.external.nodePort in body should be greater than or equal to 30000"),
		Entry("source ranges for a node port", "ext-ranges", "partitions: 3\ningestion: {external: {type: NodePort, loadBalancerSourceRanges: [10.0.0.0/8]}}",
			"loadBalancerSourceRanges is only for type LoadBalancer"),
		Entry("an advertised host that is not a host", "ext-host", "partitions: 3\ningestion: {external: {type: NodePort, advertisedHost: 'http://x/'}}",
			"spec.ingestion.external.advertisedHost in body should match"),
		Entry("an advertised host with a port", "ext-hostport", "partitions: 3\ningestion: {external: {type: NodePort, advertisedHost: 'ingest.example.com:31070'}}",
			"spec.ingestion.external.advertisedHost in body should match"),
		Entry("an advertised host that names another namespace's Service", "ext-svc", "partitions: 3\ningestion: {external: {type: NodePort, advertisedHost: 'orders-0.orders.bank.svc'}}",
			"advertisedHost must be a name clients outside the cluster resolve"),
		Entry("an advertised host that is a cluster name", "ext-local", "partitions: 3\ningestion: {external: {type: NodePort, advertisedHost: 'payments.bank.svc.cluster.local'}}",
			"advertisedHost must be a name clients outside the cluster resolve"),
		Entry("an advertised host of a single label", "ext-label", "partitions: 3\ningestion: {external: {type: NodePort, advertisedHost: payments}}",
			"advertisedHost must be a name clients outside the cluster resolve"),
		Entry("a Kafka listener on a Stream whose groups Stream's name would be too long", "k"+strings.Repeat("x", streamsv1alpha1.MaxStreamNameLength-len("-groups")), "partitions: 3\ningestion: {kafka: {enabled: true}}",
			"a Stream with a Kafka listener has a name of at most 40 characters"),
	)

	DescribeTable("rejects an invalid change to a Stream, keeping what was stored",
		func(spec, path, value, message string) {
			s := manifest(ns, "Stream", "changed", spec)
			Expect(k8s.Create(ctx, s)).To(Succeed())
			stored := get(s)
			before := field(stored, path)

			set(stored, path, value)
			expectRejected(k8s.Update(ctx, stored), message)
			expectField(get(s), path, before)
		},
		Entry("shrinking partitions", "partitions: 6", "spec.partitions", "4",
			"partitions may grow but not shrink"),
		Entry("changing replicationFactor", "partitions: 3\nreplicationFactor: 3", "spec.replicationFactor", "2",
			"replicationFactor is immutable"),
		Entry("scaling its own pool below replicationFactor", "partitions: 3\nreplicas: 5\nreplicationFactor: 5", "spec.replicas", "3",
			"replicationFactor must not exceed replicas"),
		Entry("moving to another pool", "pool: a\npartitions: 3", "spec.pool", "b",
			"pool is immutable"),
		Entry("turning its own pool's journal off", "partitions: 3\njournal: true", "spec.journal", "false",
			"journal cannot be turned off once on"),
		Entry("moving from its own pool to a shared one", "partitions: 3", "spec.pool", "b",
			"pool is immutable"),
		Entry("shrinking its storage", "partitions: 3\nstorage: {size: 20Gi}", "spec.storage.size", "10Gi",
			"size may grow but not shrink"),
		Entry("changing its storage class", "partitions: 3\nstorage: {storageClassName: fast}", "spec.storage.storageClassName", "slow",
			"storageClassName is immutable"),
	)

	It("lets partitions, replicas and storage grow", func() {
		s := manifest(ns, "Stream", "growing", "partitions: 3\nreplicas: 3\nstorage: {size: 10Gi}")
		Expect(k8s.Create(ctx, s)).To(Succeed())
		stored := get(s)
		set(stored, "spec.partitions", "8")
		set(stored, "spec.replicas", "5")
		set(stored, "spec.storage.size", "20Gi")
		Expect(k8s.Update(ctx, stored)).To(Succeed())
		Expect(field(get(s), "spec.partitions")).To(BeEquivalentTo(8))
	})
})
