package envtest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// repoRoot is the checkout's root, relative to this package.
var repoRoot = filepath.Join("..", "..")

var (
	testEnv *envtest.Environment
	k8s     client.Client
	ctx     context.Context
	cancel  context.CancelFunc
)

func TestAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "streams.catena.io API")
}

var _ = BeforeSuite(func() {
	ctx, cancel = context.WithCancel(context.Background())

	testEnv = &envtest.Environment{
		BinaryAssetsDirectory: binaryAssets(),
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred(), "failed to start kube-apiserver and etcd")

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(streamsv1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if catenaBinPath != "" {
		_ = os.RemoveAll(filepath.Dir(catenaBinPath))
	}
	if cancel != nil {
		cancel()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// binaryAssets is the directory holding kube-apiserver, etcd and kubectl:
// KUBEBUILDER_ASSETS when set, otherwise the cache hack/k8s-binaries.sh
// fills (it returns at once when the binaries are already built).
func binaryAssets() string {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	var stdout bytes.Buffer
	cmd := exec.Command(filepath.Join(repoRoot, "hack", "k8s-binaries.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, GinkgoWriter
	Expect(cmd.Run()).To(Succeed(), "hack/k8s-binaries.sh failed; its output is above")
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := lines[len(lines)-1]
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		Expect(filepath.Join(dir, bin)).To(BeAnExistingFile(), "hack/k8s-binaries.sh printed %q", dir)
	}
	return dir
}

// newNamespace creates a namespace of its own for a spec, so that specs
// never share objects. envtest runs no namespace controller, so namespaces
// are not cleaned up; the whole API server goes away with the suite.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "api-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return ns.Name
}
