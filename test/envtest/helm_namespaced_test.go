package envtest_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/internal/pki"
)

// Namespaced mode, for teams that may only own namespaces: with
// watchNamespaces the chart renders no cluster-wide RBAC, and the operator,
// running as the chart's ServiceAccount with only the Roles rendered,
// runs a Stream in a watched namespace.
var _ = Describe("Helm chart in namespaced mode", func() {
	It("runs a Stream with only the Roles it renders", func() {
		release, watched, other := newNamespace(), newNamespace(), newNamespace()
		objs := helmTemplate(release, release, "--set", "watchNamespaces={"+watched+"}")
		var sa string
		kinds := map[string]int{}
		for _, obj := range objs {
			kinds[obj.GetKind()]++
			switch obj.GetKind() {
			case "ClusterRole", "ClusterRoleBinding":
				Fail("namespaced mode rendered " + obj.GetKind() + " " + obj.GetName())
			case "ServiceAccount":
				sa = obj.GetName()
				fallthrough
			case "Role", "RoleBinding":
				Expect(k8s.Create(ctx, obj)).To(Succeed(), "%s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName())
			}
		}
		Expect(sa).NotTo(BeEmpty())
		// The leader election Role in the release namespace, and the
		// manager Role in the watched one.
		Expect(kinds).To(HaveKeyWithValue("Role", 2))
		Expect(kinds).To(HaveKeyWithValue("RoleBinding", 2))

		// The operator as the chart's ServiceAccount.
		cfg := rest.CopyConfig(testEnv.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + release + ":" + sa}
		as, err := client.New(cfg, client.Options{Scheme: k8s.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		var streams streamsv1alpha1.StreamList
		Expect(apierrors.IsForbidden(as.List(ctx, &streams, client.InNamespace(other)))).To(BeTrue(),
			"the ServiceAccount can read Streams of a namespace it does not watch")
		Expect(apierrors.IsForbidden(as.List(ctx, &streams))).To(BeTrue(), "the ServiceAccount can list Streams cluster-wide")

		// With the chart's default, the operator's own CA: its Secret in
		// the release namespace (the leader election Role's), the
		// certificates in the watched one.
		startManagerWithConfig(cfg, func(ctx context.Context, mgr ctrl.Manager) error {
			return controllers.SetupWithManager(ctx, mgr, controllers.Options{Image: testImage, Certificates: &controllers.Certificates{
				Namespace: release, SecretName: controllers.DefaultCASecret, LeafLifetime: pki.DefaultLeafLifetime,
				Rotation: pki.Rotation{Lifetime: pki.DefaultCALifetime, Propagation: pki.DefaultPropagation}}})
		}, watched)
		Expect(k8s.Create(ctx, manifest(watched, "Stream", "orders", "partitions: 2"))).To(Succeed())

		By("creating the Stream's pool, its StatefulSet, its chains and its ingestion, and writing status")
		Eventually(func(g Gomega) {
			var sts appsv1.StatefulSet
			g.Expect(k8s.Get(ctx, key(watched, "orders-pool"), &sts)).To(Succeed())
			g.Expect(k8s.Get(ctx, key(watched, "orders-ingest"), &appsv1.Deployment{})).To(Succeed())
			for _, name := range []string{"orders-0", "orders-1"} {
				var c streamsv1alpha1.ReplicationChain
				g.Expect(k8s.Get(ctx, key(watched, name), &c)).To(Succeed())
			}
			var s streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(watched, "orders"), &s)).To(Succeed())
			g.Expect(s.Status.ObservedGeneration).To(Equal(s.Generation), "the Stream's status")
			var pool streamsv1alpha1.ReplicaPool
			g.Expect(k8s.Get(ctx, key(watched, "orders-pool"), &pool)).To(Succeed())
			g.Expect(pool.Status.Selector).NotTo(BeEmpty(), "the pool's status")
			g.Expect(k8s.Get(ctx, key(release, controllers.DefaultCASecret), &corev1.Secret{})).To(Succeed(), "the CA")
			g.Expect(k8s.Get(ctx, key(watched, "orders-pool-replica-tls"), &corev1.Secret{})).To(Succeed(), "the replicas' certificate")
			g.Expect(k8s.Get(ctx, key(watched, "orders-ingest-tls"), &corev1.Secret{})).To(Succeed(), "ingestion's certificate")
		}).Should(Succeed())
	})
})
