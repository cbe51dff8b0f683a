//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// repoRoot is the checkout's root, relative to this package.
var repoRoot = filepath.Join("..", "..")

// env is what the suite was given: see doc.go.
var env struct {
	kubeconfig       string
	image            string
	releaseNamespace string
	helm             string
	kubectl          string
	ctr              string
}

var (
	k8s       client.Client
	ctx       context.Context
	cancel    context.CancelFunc
	suiteFrom time.Time
)

func TestEndToEnd(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Catena end to end")
}

var _ = BeforeSuite(func() {
	suiteFrom = time.Now()
	ctx, cancel = context.WithCancel(context.Background())
	env.kubeconfig = requireEnv("KUBECONFIG")
	env.image = requireEnv("CATENA_E2E_IMAGE")
	env.ctr = requireEnv("CATENA_E2E_CTR")
	env.helm = requireEnv("HELM")
	env.kubectl = envOr("KUBECTL", "kubectl")
	env.releaseNamespace = envOr("CATENA_E2E_RELEASE_NAMESPACE", "catena-system")

	cfg, err := clientcmd.BuildConfigFromFlags("", env.kubeconfig)
	Expect(err).NotTo(HaveOccurred(), "failed to load KUBECONFIG %s", env.kubeconfig)
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(streamsv1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	By("finding the operator installed from " + env.image)
	Eventually(func(g Gomega) {
		var deps appsv1.DeploymentList
		g.Expect(k8s.List(ctx, &deps, client.InNamespace(env.releaseNamespace),
			client.MatchingLabels{"app.kubernetes.io/name": "catena", "app.kubernetes.io/component": "operator"})).To(Succeed())
		g.Expect(deps.Items).To(HaveLen(1), "the chart's operator Deployment in %s (make deploy-local)", env.releaseNamespace)
		d := deps.Items[0]
		g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal(env.image))
		g.Expect(d.Status.AvailableReplicas).To(BeNumerically(">=", 1))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	GinkgoWriter.Printf("timing: operator available %.1fs after the suite started\n", time.Since(suiteFrom).Seconds())
})

var _ = AfterSuite(func() {
	if cancel != nil {
		cancel()
	}
	GinkgoWriter.Printf("timing: suite %.1fs\n", time.Since(suiteFrom).Seconds())
})

func requireEnv(name string) string {
	v := os.Getenv(name)
	Expect(v).NotTo(BeEmpty(), "%s is not set: run make test-e2e, or see test/e2e/doc.go", name)
	return v
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// newNamespace creates a namespace for one container of specs and deletes
// it after them (without waiting: the cluster is torn down anyway).
func newNamespace(prefix string) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		if CurrentSpecReport().Failed() {
			dumpNamespace(ns.Name)
		}
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, ns))).To(Succeed())
	})
	// Pods need the namespace's default ServiceAccount.
	Eventually(func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: "default"}, &corev1.ServiceAccount{})
	}).WithTimeout(time.Minute).Should(Succeed())
	return ns.Name
}
