package envtest_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/internal/pki"
	"github.com/catena-streams/catena/rpc/transport"
)

// cert-manager issues the certificates (issue 18): the operator asks for
// a Certificate per Secret its own CA would write, and a real
// cert-manager (its controllers, built from its Go module by
// hack/cert-manager) signs them with a CA ClusterIssuer. What it issues
// must work with Catena's TLS as the operator's own certificates do.
var _ = Describe("Certificates from cert-manager", Ordered, func() {
	const issuer = "catena-test-ca"
	var ns, opNS string
	var cm *controllers.CertManager

	BeforeAll(func() {
		startCertManager()
		By("setting up a CA ClusterIssuer: a self-signed root, kept by cert-manager")
		for _, doc := range []string{`
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: catena-test-selfsigned}
spec: {selfSigned: {}}`, `
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: catena-test-root, namespace: cert-manager}
spec:
  isCA: true
  commonName: catena test root
  secretName: catena-test-root
  privateKey: {algorithm: ECDSA, size: 256}
  issuerRef: {name: catena-test-selfsigned, kind: ClusterIssuer, group: cert-manager.io}`, `
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: ` + issuer + `}
spec: {ca: {secretName: catena-test-root}}`} {
			Expect(k8s.Create(ctx, fromYAML(doc))).To(Succeed())
		}
	})

	BeforeEach(func() {
		ns, opNS = newNamespace(), newNamespace()
		cm = &controllers.CertManager{Namespace: opNS, Issuer: controllers.IssuerRef{Name: issuer, Kind: "ClusterIssuer", Group: "cert-manager.io"},
			OperatorCertificate: controllers.DefaultOperatorCertificate, BundleConfigMap: "catena-ca-bundle", LeafLifetime: 24 * time.Hour}
		startOperator(controllers.Options{Image: testImage, Certificates: cm}, ns, opNS)
	})

	// issued reads the Secret cert-manager wrote for name and checks its
	// certificate against its ca.crt, as a peer would.
	issued := func(g Gomega, namespace, name string) (*corev1.Secret, *x509.Certificate) {
		var s corev1.Secret
		g.Expect(k8s.Get(ctx, key(namespace, name), &s)).To(Succeed())
		blk, _ := pem.Decode(s.Data[corev1.TLSCertKey])
		g.Expect(blk).NotTo(BeNil(), "Secret %s holds no certificate", name)
		cert, err := x509.ParseCertificate(blk.Bytes)
		g.Expect(err).NotTo(HaveOccurred())
		roots := x509.NewCertPool()
		g.Expect(roots.AppendCertsFromPEM(s.Data[pki.BundleKey])).To(BeTrue(), "Secret %s has no ca.crt", name)
		_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}})
		g.Expect(err).NotTo(HaveOccurred(), "Secret %s's certificate does not verify against its ca.crt", name)
		g.Expect(s.Labels).To(HaveKeyWithValue("app.kubernetes.io/component", "certificate"), "secretTemplate's labels")
		return &s, cert
	}
	certificate := func(g Gomega, namespace, name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"})
		g.Expect(k8s.Get(ctx, key(namespace, name), u)).To(Succeed())
		return u
	}

	It("has the pool's and the Stream's certificates issued, and they carry Catena's mutual TLS", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "orders", `
partitions: 1
replicationFactor: 3
access:
  users:
  - {name: app, operations: [Produce, Consume]}
`))).To(Succeed())
		operator := "spiffe://catena/ns/" + opNS + "/operator"

		By("asking for the operator's own certificate, loading it and publishing the trust bundle")
		var root []byte
		Eventually(func(g Gomega) {
			s, cert := issued(g, opNS, controllers.DefaultOperatorCertificate)
			g.Expect(cert.URIs).To(HaveLen(1))
			g.Expect(cert.URIs[0].String()).To(Equal(operator))
			root = s.Data[pki.BundleKey]
			var bundle corev1.ConfigMap
			g.Expect(k8s.Get(ctx, key(opNS, "catena-ca-bundle"), &bundle)).To(Succeed())
			g.Expect(bundle.Data[pki.BundleKey]).To(Equal(string(root)))
		}).WithTimeout(time.Minute).Should(Succeed())

		By("a Certificate per Secret, controlled by its object, and the Secrets cert-manager wrote owned by it too")
		var pool, ingest, user *corev1.Secret
		Eventually(func(g Gomega) {
			var stream streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "orders"), &stream)).To(Succeed())
			var rp streamsv1alpha1.ReplicaPool
			g.Expect(k8s.Get(ctx, key(ns, stream.PoolName()), &rp)).To(Succeed())
			for name, owner := range map[string]metav1.Object{rp.TLSSecretName(): &rp, "orders-ingest-tls": &stream, "orders-user-app": &stream} {
				crt := certificate(g, ns, name)
				g.Expect(metav1.IsControlledBy(crt, owner)).To(BeTrue(), "Certificate %s's owners %v", name, crt.GetOwnerReferences())
				s, _ := issued(g, ns, name)
				g.Expect(s.OwnerReferences).To(ContainElement(HaveField("UID", owner.GetUID())), "Secret %s goes with %s", name, owner.GetName())
			}
			var c *x509.Certificate
			pool, c = issued(g, ns, rp.TLSSecretName())
			g.Expect(c.URIs[0].String()).To(Equal("spiffe://catena/ns/" + ns + "/pool/" + rp.Name))
			g.Expect(c.VerifyHostname(rp.Name + "-1." + rp.Name + "." + ns + ".svc")).To(Succeed())
			g.Expect(c.VerifyHostname(transport.MetricsServerName)).To(Succeed())
			ingest, c = issued(g, ns, "orders-ingest-tls")
			g.Expect(c.URIs[0].String()).To(Equal("spiffe://catena/ns/" + ns + "/ingest/orders"))
			user, c = issued(g, ns, "orders-user-app")
			g.Expect(c.URIs[0].String()).To(Equal("spiffe://catena/ns/" + ns + "/stream/orders/user/app"))
			g.Expect(c.DNSNames).To(BeEmpty())

			var bundle corev1.Secret
			g.Expect(k8s.Get(ctx, key(ns, "orders-ca"), &bundle)).To(Succeed())
			g.Expect(bundle.Data).To(Equal(map[string][]byte{pki.BundleKey: root}), "the clients' bundle")

			var sts appsv1.StatefulSet
			g.Expect(k8s.Get(ctx, key(ns, rp.Name), &sts)).To(Succeed())
			g.Expect(sts.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Secret.SecretName", rp.TLSSecretName())))
			g.Expect(sts.Spec.Template.Spec.Containers[0].Args).To(ContainElements("--tls-ca=/etc/catena/tls/ca.crt", "--allow-admin="+operator))
		}).WithTimeout(time.Minute).Should(Succeed())

		By("the operator's certificate in memory opening a mutual TLS link to a replica serving the pool's")
		Expect(handshake(pool, "orders-pool-0.orders-pool."+ns+".svc", cm.ClientTLS())).To(Equal(operator))
		By("the app user's certificate opening one to ingestion serving the Stream's")
		userTLS, err := secretFiles(user).Config()
		Expect(err).NotTo(HaveOccurred())
		Expect(handshake(ingest, "orders."+ns+".svc", userTLS)).To(Equal("spiffe://catena/ns/" + ns + "/stream/orders/user/app"))
		By("a certificate of another CA refused by the replica")
		data, _, _, err := pki.PlanCA(nil, "elsewhere", time.Now(), time.Time{}, pki.Rotation{Lifetime: 1000 * time.Hour})
		Expect(err).NotTo(HaveOccurred())
		other, err := pki.ParseCA(data)
		Expect(err).NotTo(HaveOccurred())
		certPEM, keyPEM, err := other.Issue(pki.Leaf{Identity: operator, Lifetime: time.Hour}, time.Now())
		Expect(err).NotTo(HaveOccurred())
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		Expect(err).NotTo(HaveOccurred())
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pool.Data[pki.BundleKey])
		// It trusts the replica; the replica must not trust it.
		forged := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}, RootCAs: roots}
		_, err = handshakeErr(pool, "orders-pool-0.orders-pool."+ns+".svc", forged)
		Expect(err).To(HaveOccurred(), "a certificate naming the operator, from another CA")

		By("a user removed from spec.access losing the Certificate and the Secret")
		var stream streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, key(ns, "orders"), &stream)).To(Succeed())
		stream.Spec.Access.Users = nil
		Expect(k8s.Update(ctx, &stream)).To(Succeed())
		Eventually(func(g Gomega) {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"})
			g.Expect(k8s.Get(ctx, key(ns, "orders-user-app"), u)).To(MatchError(ContainSubstring("not found")))
			g.Expect(k8s.Get(ctx, key(ns, "orders-user-app"), &corev1.Secret{})).To(MatchError(ContainSubstring("not found")))
		}).Should(Succeed())
	})

	It("never takes over a Certificate that is not its own", func() {
		Expect(k8s.Create(ctx, fromYAML(`
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: orders-ingest-tls, namespace: `+ns+`}
spec:
  secretName: someone-elses
  dnsNames: [example.com]
  issuerRef: {name: `+issuer+`, kind: ClusterIssuer}`))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "orders", "partitions: 1\nreplicationFactor: 1"))).To(Succeed())
		By("waiting for the operator to say why the Stream cannot run")
		Eventually(func(g Gomega) {
			g.Expect(objectEvents(g, ns, "Stream", "orders", "CertificateFailed")).To(ContainElement(
				ContainSubstring("certificate orders-ingest-tls exists and is not the operator's")))
		}).Should(Succeed())
		Consistently(func(g Gomega) {
			crt := certificate(g, ns, "orders-ingest-tls")
			name, _, _ := unstructured.NestedString(crt.Object, "spec", "secretName")
			g.Expect(name).To(Equal("someone-elses"))
			g.Expect(crt.GetOwnerReferences()).To(BeEmpty())
		}).WithTimeout(3 * time.Second).Should(Succeed())
	})
})

// startCertManager runs cert-manager's controllers (hack/cert-manager,
// built once into the cache outside the checkout) against the suite's API
// server, until the suite ends.
func startCertManager() {
	var stdout bytes.Buffer
	build := exec.Command(filepath.Join(repoRoot, "hack", "cert-manager", "build.sh"))
	build.Stdout, build.Stderr = &stdout, GinkgoWriter
	Expect(build.Run()).To(Succeed(), "hack/cert-manager/build.sh failed; its output is above")
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	bin := lines[len(lines)-1]

	// cert-manager's CRDs, as released with that module.
	list := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/cert-manager/cert-manager")
	list.Dir = filepath.Join(repoRoot, "hack", "cert-manager")
	out, err := list.Output()
	Expect(err).NotTo(HaveOccurred(), "go list the cert-manager module")
	crds := filepath.Join(strings.TrimSpace(string(out)), "deploy", "crds")
	_, err = envtest.InstallCRDs(testEnv.Config, envtest.CRDInstallOptions{Paths: []string{crds}, ErrorIfPathMissing: true})
	Expect(err).NotTo(HaveOccurred(), "installing cert-manager's CRDs from %s", crds)

	user, err := testEnv.AddUser(envtest.User{Name: "cert-manager", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kubeconfig, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	dir := GinkgoT().TempDir()
	Expect(os.WriteFile(filepath.Join(dir, "kubeconfig"), kubeconfig, 0o600)).To(Succeed())
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cert-manager"}})).To(Or(Succeed(), MatchError(ContainSubstring("already exists"))))

	logPath := filepath.Join(dir, "cert-manager.log")
	logf, err := os.Create(logPath)
	Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command(bin, "--kubeconfig", filepath.Join(dir, "kubeconfig"), "--cluster-resource-namespace", "cert-manager", "-v", "2")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	Expect(cmd.Start()).To(Succeed())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }()
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			GinkgoWriter.Printf("---- cert-manager (tail)\n%s\n", b)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

// secretFiles writes a certificate Secret's files as a pod's volume would
// hold them.
func secretFiles(s *corev1.Secret) transport.TLSFiles {
	dir := GinkgoT().TempDir()
	f := transport.TLSFiles{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), ClientCAFile: filepath.Join(dir, "ca.crt")}
	for path, k := range map[string]string{f.CertFile: corev1.TLSCertKey, f.KeyFile: corev1.TLSPrivateKeyKey, f.ClientCAFile: pki.BundleKey} {
		Expect(os.WriteFile(path, s.Data[k], 0o600)).To(Succeed())
	}
	return f
}

// handshake serves the certificate of server as Catena's pods do and opens
// a link to it as serverName with client; it returns the identity the
// server saw.
func handshake(server *corev1.Secret, serverName string, client *tls.Config) string {
	id, err := handshakeErr(server, serverName, client)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return id
}

func handshakeErr(server *corev1.Secret, serverName string, client *tls.Config) (string, error) {
	serverTLS, err := secretFiles(server).Config()
	Expect(err).NotTo(HaveOccurred())
	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverTLS)
	Expect(err).NotTo(HaveOccurred())
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			seen <- ""
			return
		}
		defer conn.Close()
		tc := conn.(*tls.Conn)
		if tc.Handshake() != nil || len(tc.ConnectionState().PeerCertificates) == 0 {
			seen <- ""
			return
		}
		seen <- transport.CertIdentity(tc.ConnectionState().PeerCertificates[0])
	}()
	cfg := client.Clone()
	cfg.ServerName = serverName
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	// TLS 1.3: the server's verdict on the client's certificate arrives
	// with the first read.
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, _ = conn.Read(make([]byte, 1))
	select {
	case id := <-seen:
		if id == "" {
			return "", errors.New("the server refused the client's certificate")
		}
		return id, nil
	case <-time.After(5 * time.Second):
		return "", errors.New("the server saw no handshake")
	}
}
