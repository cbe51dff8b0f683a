package envtest_test

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/internal/pki"
)

// The operator's own CA (issue 18): it creates its CA in its namespace,
// issues each operand a certificate naming its identity, runs the pods
// with them and with the --allow-* flags, gives each Stream user a client
// certificate, and never writes over a Secret that is not its own.
var _ = Describe("The operator's certificates", func() {
	var ns, opNS string
	BeforeEach(func() {
		ns, opNS = newNamespace(), newNamespace()
		startOperator(controllers.Options{Image: testImage, Certificates: &controllers.Certificates{
			Namespace: opNS, SecretName: controllers.DefaultCASecret, LeafLifetime: 24 * time.Hour,
			Rotation: pki.Rotation{Lifetime: 30 * 24 * time.Hour, Propagation: time.Minute},
		}}, ns, opNS)
	})

	// leaf reads a Secret the operator issued and checks its certificate
	// against the CA bundle it carries, as a peer would.
	leaf := func(g Gomega, name string) *x509.Certificate {
		var s corev1.Secret
		g.Expect(k8s.Get(ctx, key(ns, name), &s)).To(Succeed())
		g.Expect(s.Type).To(Equal(corev1.SecretTypeTLS))
		g.Expect(s.Labels).To(HaveKeyWithValue("app.kubernetes.io/component", "certificate"))
		blk, _ := pem.Decode(s.Data[pki.CertKey])
		g.Expect(blk).NotTo(BeNil(), "Secret %s holds no certificate", name)
		cert, err := x509.ParseCertificate(blk.Bytes)
		g.Expect(err).NotTo(HaveOccurred())
		roots := x509.NewCertPool()
		g.Expect(roots.AppendCertsFromPEM(s.Data[pki.BundleKey])).To(BeTrue())
		_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		g.Expect(err).NotTo(HaveOccurred(), "Secret %s's certificate does not verify against its bundle", name)
		return cert
	}
	uri := func(c *x509.Certificate) string {
		if len(c.URIs) == 0 {
			return ""
		}
		return c.URIs[0].String()
	}
	hasArg := func(args []string, prefix string) string {
		for _, a := range args {
			if strings.HasPrefix(a, prefix) {
				return a
			}
		}
		return ""
	}
	var operator string
	JustBeforeEach(func() { operator = "spiffe://catena/ns/" + opNS + "/operator" })

	It("issues the pool's replicas a certificate and runs them with mutual TLS, admin calls for the operator only", func() {
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "orders", `replicas: 3`))).To(Succeed())

		By("creating its CA in its own namespace")
		Eventually(func(g Gomega) {
			var ca corev1.Secret
			g.Expect(k8s.Get(ctx, key(opNS, controllers.DefaultCASecret), &ca)).To(Succeed())
			g.Expect(ca.Data).To(HaveKey(pki.KeyKey))
			g.Expect(ca.Data).To(HaveKey(pki.BundleKey))
			var bundle corev1.ConfigMap
			g.Expect(k8s.Get(ctx, key(opNS, controllers.DefaultCASecret+"-bundle"), &bundle)).To(Succeed(), "the published bundle")
			g.Expect(bundle.Data[pki.BundleKey]).To(Equal(string(ca.Data[pki.BundleKey])))
		}).Should(Succeed())

		Eventually(func(g Gomega) {
			c := leaf(g, "orders-replica-tls")
			g.Expect(uri(c)).To(Equal("spiffe://catena/ns/" + ns + "/pool/orders"))
			g.Expect(c.DNSNames).To(ContainElement("*.orders." + ns + ".svc"))
			g.Expect(c.VerifyHostname("orders-1.orders." + ns + ".svc")).To(Succeed())

			var sts appsv1.StatefulSet
			g.Expect(k8s.Get(ctx, key(ns, "orders"), &sts)).To(Succeed())
			pod := sts.Spec.Template.Spec
			g.Expect(pod.Volumes).To(ContainElement(HaveField("Secret.SecretName", "orders-replica-tls")))
			args := pod.Containers[0].Args
			g.Expect(args).To(ContainElements("--tls-cert=/etc/catena/tls/tls.crt", "--tls-key=/etc/catena/tls/tls.key", "--tls-ca=/etc/catena/tls/ca.crt",
				"--allow-admin="+operator,
				"--allow-replication=spiffe://catena/ns/"+ns+"/pool/orders",
				"--allow-data=spiffe://catena/ns/"+ns+"/ingest/*,"+operator))
		}).Should(Succeed())
	})

	It("gives each Stream user a client certificate, runs ingestion with the Stream's access, and takes a removed user's away", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "payments", `
partitions: 2
replicationFactor: 3
access:
  users:
  - {name: billing, operations: [Produce, Consume]}
  - {name: audit, operations: [Consume]}
`))).To(Succeed())
		user := func(name string) string { return "spiffe://catena/ns/" + ns + "/stream/payments/user/" + name }
		workers := "spiffe://catena/ns/" + ns + "/aggregation/*"
		Eventually(func(g Gomega) {
			c := leaf(g, "payments-ingest-tls")
			g.Expect(uri(c)).To(Equal("spiffe://catena/ns/" + ns + "/ingest/payments"))
			g.Expect(c.VerifyHostname("payments."+ns+".svc")).To(Succeed(), "the ingestion Service's name")
			g.Expect(uri(leaf(g, "payments-user-billing"))).To(Equal(user("billing")))
			g.Expect(uri(leaf(g, "payments-user-audit"))).To(Equal(user("audit")))
			var bundle corev1.Secret
			g.Expect(k8s.Get(ctx, key(ns, "payments-ca"), &bundle)).To(Succeed())
			g.Expect(bundle.Data).To(HaveKey(pki.BundleKey))
			g.Expect(bundle.Data).NotTo(HaveKey(pki.KeyKey), "the clients' bundle holds a key")

			var d appsv1.Deployment
			g.Expect(k8s.Get(ctx, key(ns, "payments-ingest"), &d)).To(Succeed())
			args := d.Spec.Template.Spec.Containers[0].Args
			g.Expect(args).To(ContainElements("--stream=payments",
				"--allow-produce="+user("billing"),
				"--allow-consume="+user("billing")+","+user("audit")+","+workers+","+operator,
				"--allow-other-streams="+workers+","+operator))
			g.Expect(d.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Secret.SecretName", "payments-ingest-tls")))
		}).Should(Succeed())

		By("removing a user")
		Eventually(func(g Gomega) {
			var st streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "payments"), &st)).To(Succeed())
			st.Spec.Access.Users = []streamsv1alpha1.StreamUser{{Name: "billing", Operations: []streamsv1alpha1.StreamOperation{streamsv1alpha1.OperationProduce}}}
			g.Expect(k8s.Update(ctx, &st)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			var gone corev1.Secret
			err := k8s.Get(ctx, key(ns, "payments-user-audit"), &gone)
			g.Expect(err).To(HaveOccurred(), "the removed user's Secret is still there")
			var d appsv1.Deployment
			g.Expect(k8s.Get(ctx, key(ns, "payments-ingest"), &d)).To(Succeed())
			args := d.Spec.Template.Spec.Containers[0].Args
			g.Expect(hasArg(args, "--allow-consume=")).To(Equal("--allow-consume=" + workers + "," + operator))
		}).Should(Succeed())
	})

	It("runs a Stream without access open to any client, over TLS", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "open", `partitions: 1`))).To(Succeed())
		Eventually(func(g Gomega) {
			var d appsv1.Deployment
			g.Expect(k8s.Get(ctx, key(ns, "open-ingest"), &d)).To(Succeed())
			args := d.Spec.Template.Spec.Containers[0].Args
			g.Expect(args).To(ContainElements("--allow-produce=anyone", "--allow-consume=anyone", "--tls-ca=/etc/catena/tls/ca.crt"))
		}).Should(Succeed())
	})

	It("never writes over a Secret in the way of a certificate", func() {
		theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken-replica-tls"}, StringData: map[string]string{"mine": "yes"}}
		Expect(k8s.Create(ctx, theirs)).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "taken", `replicas: 1`))).To(Succeed())
		By("waiting for the operator to say why the pool cannot run")
		Eventually(func(g Gomega) {
			g.Expect(objectEvents(g, ns, "ReplicaPool", "taken", "CertificateFailed")).To(ContainElement(
				ContainSubstring("secret taken-replica-tls exists and is not the operator's")))
		}).Should(Succeed())
		Consistently(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8s.Get(ctx, key(ns, "taken-replica-tls"), &s)).To(Succeed())
			g.Expect(s.Data).To(Equal(map[string][]byte{"mine": []byte("yes")}))
			var sts appsv1.StatefulSet
			g.Expect(k8s.Get(ctx, key(ns, "taken"), &sts)).NotTo(Succeed(), "replicas were run without their certificate")
		}).WithTimeout(3 * time.Second).Should(Succeed())
	})

	It("gives an Aggregation's checkpoint Stream no users: only the workers and the operator reach it", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "clicks", `partitions: 1`))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Aggregation", "counts", `
source: clicks
aggregates: [{name: total, function: Count}]
`))).To(Succeed())
		Eventually(func(g Gomega) {
			var cp streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "counts-checkpoints"), &cp)).To(Succeed())
			g.Expect(cp.Spec.Access).NotTo(BeNil())
			g.Expect(cp.Spec.Access.Users).To(BeEmpty())
			c := leaf(g, "counts-aggregator-tls")
			g.Expect(uri(c)).To(Equal("spiffe://catena/ns/" + ns + "/aggregation/counts"))
			var sts appsv1.StatefulSet
			g.Expect(k8s.Get(ctx, key(ns, "counts-aggregator"), &sts)).To(Succeed())
			g.Expect(sts.Spec.Template.Spec.Containers[0].Args).To(ContainElements("--tls-cert=/etc/catena/tls/tls.crt",
				"--allow-admin="+operator, "--allow-query=anyone,spiffe://catena/ns/"+ns+"/aggregation/counts"))
		}).Should(Succeed())
	})

	DescribeTable("rejects an invalid access list",
		func(spec, message string) {
			s := manifest(ns, "Stream", "bad-access", "partitions: 1\n"+spec)
			expectRejected(k8s.Create(ctx, s), message)
			expectAbsent(s)
		},
		Entry("an unknown operation", `access: {users: [{name: a, operations: [Delete]}]}`, `Unsupported value: "Delete"`),
		Entry("no operation", `access: {users: [{name: a, operations: []}]}`, "should have at least 1 items"),
		Entry("a user name that is not a DNS label", `access: {users: [{name: Bob, operations: [Produce]}]}`, "spec.access.users[0].name in body should match"),
		Entry("a user twice", `access: {users: [{name: a, operations: [Produce]}, {name: a, operations: [Consume]}]}`, "Duplicate value"),
	)
})

// A CA of the user's own, put in the CA Secret before the operator starts,
// is the one that issues.
var _ = Describe("The operator's certificates from a CA of one's own", func() {
	It("issues from the CA Secret it finds, and publishes its bundle", func() {
		ns, opNS := newNamespace(), newNamespace()
		own, _, _, err := pki.PlanCA(nil, "acme intermediate", time.Now(), time.Time{}, pki.Rotation{Lifetime: 365 * 24 * time.Hour})
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: controllers.DefaultCASecret}, Data: own})).To(Succeed())
		startOperator(controllers.Options{Image: testImage, Certificates: &controllers.Certificates{
			Namespace: opNS, SecretName: controllers.DefaultCASecret, LeafLifetime: 24 * time.Hour,
			Rotation: pki.Rotation{Lifetime: 30 * 24 * time.Hour, Propagation: time.Minute},
		}}, ns, opNS)
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "mine", `replicas: 1`))).To(Succeed())
		roots := x509.NewCertPool()
		Expect(roots.AppendCertsFromPEM(own[pki.BundleKey])).To(BeTrue())
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8s.Get(ctx, key(ns, "mine-replica-tls"), &s)).To(Succeed())
			blk, _ := pem.Decode(s.Data[pki.CertKey])
			g.Expect(blk).NotTo(BeNil())
			cert, err := x509.ParseCertificate(blk.Bytes)
			g.Expect(err).NotTo(HaveOccurred())
			_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			g.Expect(err).NotTo(HaveOccurred(), "not issued by the CA put in the Secret")
			var cm corev1.ConfigMap
			g.Expect(k8s.Get(ctx, key(opNS, controllers.DefaultCASecret+"-bundle"), &cm)).To(Succeed())
			g.Expect(cm.Data[pki.BundleKey]).To(Equal(string(own[pki.BundleKey])))
		}).Should(Succeed())
		var stored corev1.Secret
		Expect(k8s.Get(ctx, key(opNS, controllers.DefaultCASecret), &stored)).To(Succeed())
		Expect(stored.Data).To(Equal(own), "the operator changed a CA it was given")
	})
})
