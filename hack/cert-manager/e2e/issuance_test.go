// Package e2e runs the cert-manager controller that ../build.sh builds
// against a real kube-apiserver and etcd (controller-runtime's envtest) with
// cert-manager's CRDs, and checks it issues a CA and a leaf from it.
package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// clusterResourceNamespace is where the CA Certificate's Secret lives, so
// that the CA ClusterIssuer can read it.
const clusterResourceNamespace = "cert-manager"

// manifests are what a user of cert-manager would apply: a self-signed
// ClusterIssuer, a CA Certificate from it, a CA ClusterIssuer on that CA,
// and a leaf Certificate shaped like the ones the operator asks for.
const manifests = `
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: selfsigned}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: catena-ca, namespace: cert-manager}
spec:
  isCA: true
  commonName: catena-ca
  secretName: catena-ca
  privateKey: {algorithm: ECDSA, size: 256}
  issuerRef: {name: selfsigned, kind: ClusterIssuer, group: cert-manager.io}
---
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: catena-ca}
spec: {ca: {secretName: catena-ca}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: leaf, namespace: default}
spec:
  secretName: leaf-tls
  duration: 2160h
  uris: [spiffe://catena/ns/default/pool/p]
  dnsNames: [p-0.p.default.svc, p.default.svc]
  ipAddresses: [127.0.0.1]
  privateKey: {algorithm: ECDSA, size: 256, rotationPolicy: Always}
  usages: [server auth, client auth, digital signature, key encipherment]
  secretTemplate:
    labels: {app.kubernetes.io/component: certificate, streams.catena.io/pool: p}
  issuerRef: {name: catena-ca, kind: ClusterIssuer, group: cert-manager.io}
`

func TestIssuance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	bin := lastLine(t, run(t, "../build.sh"))
	env := &envtest.Environment{
		BinaryAssetsDirectory: binaryAssets(t),
		CRDDirectoryPaths:     []string{crdDir(t)},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	k8s, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}

	// The controller runs as an admin with a kubeconfig of its own, the way
	// it would outside a cluster.
	admin, err := env.AddUser(envtest.User{Name: "cert-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: clusterResourceNamespace}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}

	controller := startController(t, bin, kubeconfigPath, clusterResourceNamespace)
	start := time.Now()
	for _, doc := range strings.Split(manifests, "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatal(err)
		}
		if err := k8s.Create(ctx, obj); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}

	secret := waitForSecret(ctx, t, k8s, types.NamespacedName{Namespace: "default", Name: "leaf-tls"})
	t.Logf("leaf Secret issued %v after the manifests were applied", time.Since(start).Round(time.Millisecond))
	checkLeaf(t, secret)
	waitForReady(ctx, t, k8s, types.NamespacedName{Namespace: "default", Name: "leaf"})

	controller.stop(t)
}

// checkLeaf checks the Secret cert-manager wrote for the leaf Certificate:
// its labels, its key matching its certificate, and the certificate
// verifying against ca.crt with the SANs, key and usages asked for.
func checkLeaf(t *testing.T, s *corev1.Secret) {
	t.Helper()
	for k, v := range map[string]string{"app.kubernetes.io/component": "certificate", "streams.catena.io/pool": "p"} {
		if s.Labels[k] != v {
			t.Errorf("Secret label %s = %q, want %q (labels %v)", k, s.Labels[k], v, s.Labels)
		}
	}
	if s.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret type %q, want %q", s.Type, corev1.SecretTypeTLS)
	}
	if _, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"]); err != nil {
		t.Errorf("tls.key does not match tls.crt: %v", err)
	}
	blk, _ := pem.Decode(s.Data["tls.crt"])
	if blk == nil {
		t.Fatal("tls.crt holds no PEM certificate")
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.Data["ca.crt"]) {
		t.Fatal("ca.crt holds no PEM certificate")
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("leaf does not verify against ca.crt for %v: %v", usage, err)
		}
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://catena/ns/default/pool/p" {
		t.Errorf("leaf URI SANs %v, want [spiffe://catena/ns/default/pool/p]", leaf.URIs)
	}
	if strings.Join(leaf.DNSNames, ",") != "p-0.p.default.svc,p.default.svc" {
		t.Errorf("leaf DNS SANs %v", leaf.DNSNames)
	}
	if len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != "127.0.0.1" {
		t.Errorf("leaf IP SANs %v, want [127.0.0.1]", leaf.IPAddresses)
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("leaf key is %T, want ECDSA P-256", leaf.PublicKey)
	}
	if want := x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment; leaf.KeyUsage != want {
		t.Errorf("leaf key usage %b, want %b", leaf.KeyUsage, want)
	}
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got != 2160*time.Hour {
		t.Errorf("leaf lifetime %v, want 2160h", got)
	}
	if leaf.IsCA {
		t.Error("leaf is a CA")
	}
}

// waitForSecret waits until the Secret exists and holds tls.crt, tls.key
// and ca.crt.
func waitForSecret(ctx context.Context, t *testing.T, k8s client.Client, key types.NamespacedName) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	poll(ctx, t, "Secret "+key.String()+" with tls.crt, tls.key and ca.crt", func() bool {
		if k8s.Get(ctx, key, &s) != nil {
			return false
		}
		return len(s.Data["tls.crt"]) > 0 && len(s.Data["tls.key"]) > 0 && len(s.Data["ca.crt"]) > 0
	})
	return &s
}

// waitForReady waits until the Certificate's Ready condition is True.
func waitForReady(ctx context.Context, t *testing.T, k8s client.Client, key types.NamespacedName) {
	t.Helper()
	poll(ctx, t, "Certificate "+key.String()+" Ready", func() bool {
		crt := &unstructured.Unstructured{}
		crt.SetAPIVersion("cert-manager.io/v1")
		crt.SetKind("Certificate")
		if k8s.Get(ctx, key, crt) != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(crt.Object, "status", "conditions")
		for _, c := range conds {
			c, _ := c.(map[string]any)
			if c["type"] == "Ready" && c["status"] == "True" {
				return true
			}
		}
		return false
	})
}

// poll calls done every 100ms until it returns true, failing the test when
// ctx ends first.
func poll(ctx context.Context, t *testing.T, what string, done func() bool) {
	t.Helper()
	for !done() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// process is the running controller; its log goes to a file that the test
// prints when it fails.
type process struct {
	cmd  *exec.Cmd
	done chan error
}

// startController runs the controller binary against the API server the
// kubeconfig names.
func startController(t *testing.T, bin, kubeconfig, clusterResourceNamespace string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "cert-manager.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig,
		"--cluster-resource-namespace="+clusterResourceNamespace, "-v=2")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); logFile.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("cert-manager controller log:\n%s", log)
		}
	})
	return p
}

// stop sends SIGTERM and expects the controller to exit 0 promptly.
func (p *process) stop(t *testing.T) {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("controller exited with %v after SIGTERM", err)
		}
		t.Logf("controller exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Error("controller still running 30s after SIGTERM")
	}
}

// binaryAssets is the directory holding kube-apiserver and etcd:
// KUBEBUILDER_ASSETS when set, otherwise the cache ../../k8s-binaries.sh
// fills (it returns at once when the binaries are already built).
func binaryAssets(t *testing.T) string {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	return lastLine(t, run(t, "../../k8s-binaries.sh"))
}

// crdDir is deploy/crds of the cert-manager module this module requires.
// Those CRDs are plain controller-gen output, not Helm templates, so they
// are used as they are from the module cache.
func crdDir(t *testing.T) string {
	dir := strings.TrimSpace(run(t, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/cert-manager/cert-manager"))
	return filepath.Join(dir, "deploy", "crds")
}

// run runs a command, passing its stderr through, and returns its stdout.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	var stdout bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return stdout.String()
}

// lastLine is the last line of a script's output: the path it prints.
func lastLine(t *testing.T, out string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}
