package envtest_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// The samples are what a user copies first: they must stay valid.
var _ = Describe("config/samples", func() {
	It("are accepted by the API server", func() {
		files, err := filepath.Glob(filepath.Join(repoRoot, "config", "samples", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		ns := newNamespace()
		var created []string
		for _, file := range files {
			if filepath.Base(file) == "kustomization.yaml" {
				continue
			}
			data, err := os.ReadFile(file)
			Expect(err).NotTo(HaveOccurred())
			for _, doc := range strings.Split(string(data), "\n---\n") {
				if strings.TrimSpace(doc) == "" {
					continue
				}
				obj := fromYAML(doc)
				obj.SetNamespace(ns)
				Expect(k8s.Create(ctx, obj)).To(Succeed(), "%s: %s %s", file, obj.GetKind(), obj.GetName())
				created = append(created, obj.GetKind()+"/"+obj.GetName())
			}
		}
		Expect(created).To(ContainElements("Stream/events", "ReplicaPool/shared", "Stream/orders", "Stream/clicks"))
	})
})

// `kubectl get` tells the story through the print columns.
var _ = Describe("kubectl get", func() {
	It("shows the columns of every kind", func() {
		ns := newNamespace()
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "shared", `{}`))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "orders", "pool: shared\npartitions: 1"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Partition", "orders-0", "stream: orders\nindex: 0"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "ReplicationChain", "orders-0",
			"stream: orders\npartition: 0\npool: shared\nreplicationFactor: 3"))).To(Succeed())

		// Status as the operator will write it.
		var chain streamsv1alpha1.ReplicationChain
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders-0"}, &chain)).To(Succeed())
		chain.Status = streamsv1alpha1.ReplicationChainStatus{
			TargetEpoch: 4,
			Members: []streamsv1alpha1.ChainMember{
				{Name: "shared-2", State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: 4},
				{Name: "shared-0", State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: 4},
			},
			LastReconfiguration: &streamsv1alpha1.Reconfiguration{
				Time: metav1.Now(), Epoch: 4, Reason: streamsv1alpha1.ReconfigurationHeadFailed,
			},
		}
		Expect(k8s.Status().Update(ctx, &chain)).To(Succeed())
		var part streamsv1alpha1.Partition
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders-0"}, &part)).To(Succeed())
		part.Status = streamsv1alpha1.PartitionStatus{
			Head: chain.Head(), Tail: chain.Tail(), ChainEpoch: 4, CommittedOffset: 1200, LogStartOffset: 300,
		}
		Expect(k8s.Status().Update(ctx, &part)).To(Succeed())

		kubectl := testEnv.ControlPlane.KubeCtl()
		// KubeCtl looks in KUBEBUILDER_ASSETS only, not BinaryAssetsDirectory.
		kubectl.Path = filepath.Join(testEnv.BinaryAssetsDirectory, "kubectl")
		Expect(kubectl.Path).To(BeAnExistingFile(), "hack/k8s-binaries.sh builds kubectl beside kube-apiserver")
		stdout, stderr, err := kubectl.Run("get", "-n", ns, "replicapools,streams,partitions,replicationchains")
		Expect(err).NotTo(HaveOccurred(), "kubectl: %s", readAll(stderr))
		out := readAll(stdout)
		GinkgoWriter.Println(out)
		for _, header := range [][]string{
			{"REPLICAS", "READY REPLICAS", "STREAMS", "CHAINS", "STORAGE", "READY"},
			{"POOL", "PARTITIONS", "READY PARTITIONS", "RF", "READY", "REASON"},
			{"STREAM", "INDEX", "HEAD", "TAIL", "EPOCH", "COMMITTED", "LOG START", "READY"},
			{"STREAM", "PARTITION", "EPOCH", "HEAD", "LAST CHANGE", "READY"},
		} {
			Expect(out).To(MatchRegexp(strings.Join(header, `\s+`)))
		}
		Expect(out).To(MatchRegexp(`orders-0\s+orders\s+0\s+shared-2\s+shared-0\s+4\s+1200\s+300`))
		Expect(out).To(MatchRegexp(`orders-0\s+orders\s+0\s+4\s+shared-2\s+HeadFailed`))
		Expect(out).To(ContainSubstring("replicapool.streams.catena.io/shared"))
		Expect(out).To(ContainSubstring("replicationchain.streams.catena.io/orders-0"))
	})
})

func readAll(r io.Reader) string {
	var b bytes.Buffer
	_, _ = io.Copy(&b, r)
	return b.String()
}
