//go:build e2e

package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// userTLSFiles writes the client certificate the operator issued a Stream's
// user to files, and returns catenactl's flags for them.
func userTLSFiles(ns, stream, user string) []string {
	var s corev1.Secret
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: clientSecret(stream, user)}, &s)).To(Succeed())
	dir := GinkgoT().TempDir()
	var args []string
	for _, f := range []struct{ key, flag string }{{"ca.crt", "--tls-ca"}, {"tls.crt", "--tls-cert"}, {"tls.key", "--tls-key"}} {
		path := filepath.Join(dir, f.key)
		Expect(os.WriteFile(path, s.Data[f.key], 0o600)).To(Succeed())
		args = append(args, f.flag, path)
	}
	return args
}

// expectAccessEnforced is issue 18's done-when on a real node, with the
// operator's own CA: a client whose identity the Stream does not allow to
// produce is refused, one it allows succeeds, one without a certificate is
// refused; and a caller with a certificate of the same CA that is not the
// operator's is refused Status and every admin call on a replica's port, which stores
// nothing new.
func expectAccessEnforced(ns, stream, pool, writer, reader string) {
	var s streamsv1alpha1.Stream
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: stream}, &s)).To(Succeed())
	server := s.Status.Endpoints.Producers

	By("producing as a user allowed only to consume")
	out, phase := runPodToEnd(ns, "produce-as-reader", clientSecret(stream, reader),
		"--server", server, "produce", "--stream", stream, "--value", "not allowed", "--retry-timeout", "20s")
	Expect(phase).To(Equal(corev1.PodFailed), "the reader's produce succeeded:\n%s", out)
	Expect(out).To(ContainSubstring(fmt.Sprintf("may not call /catena.v1.Ingest/ProduceStream on stream %s", stream)))
	GinkgoWriter.Printf("refused: %s\n", out)

	By("producing without a client certificate")
	out, phase = runPodToEnd(ns, "produce-anonymous", clientSecret(stream, ""),
		"--server", server, "produce", "--stream", stream, "--value", "anonymous", "--retry-timeout", "20s")
	Expect(phase).To(Equal(corev1.PodFailed), "a produce without a certificate succeeded:\n%s", out)
	Expect(out).To(ContainSubstring("needs a client certificate"))

	By("producing and consuming as the user allowed both")
	value := fmt.Sprintf("allowed %d", time.Now().UnixNano())
	runPod(ns, "produce-as-writer", clientSecret(stream, writer),
		"--server", server, "produce", "--stream", stream, "--key", "allowed", "--value", value, "--retry-timeout", "1m")
	Expect(runPod(ns, "consume-as-reader", clientSecret(stream, reader),
		"--server", server, "consume", "--stream", stream, "--from", "earliest", "--no-follow")).To(ContainSubstring(value))

	By("calling a replica's admin API with a certificate of the same CA that is not the operator's")
	var pod corev1.Pod
	victim := pool + "-0"
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: victim}, &pod)).To(Succeed())
	Expect(pod.Status.PodIP).NotTo(BeEmpty())
	var secret corev1.Secret
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: clientSecret(stream, writer)}, &secret)).To(Succeed())
	roots := x509.NewCertPool()
	Expect(roots.AppendCertsFromPEM(secret.Data["ca.crt"])).To(BeTrue())
	pair, err := tls.X509KeyPair(secret.Data["tls.crt"], secret.Data["tls.key"])
	Expect(err).NotTo(HaveOccurred())
	// The pod's IP is reachable from the node; the certificate names the
	// pod's DNS name, which the node cannot resolve.
	serverName := fmt.Sprintf("%s.%s.%s.svc", victim, pool, ns)
	addr := net.JoinHostPort(pod.Status.PodIP, "7071")
	dial := func(cfg *tls.Config) catenapb.ReplicaClient {
		conn, err := transport.Dial(addr, cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(conn.Close)
		return catenapb.NewReplicaClient(conn)
	}
	user := dial(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: serverName, Certificates: []tls.Certificate{pair}})
	anonymous := dial(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: serverName})
	call := func(f func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return f(cctx)
	}
	records := func() int {
		return len(jsonLines(runPod(ns, fmt.Sprintf("count-%d", time.Now().UnixNano()), clientSecret(stream, reader),
			"--server", server, "consume", "--stream", stream, "--from", "earliest", "--no-follow")))
	}
	before := records()
	err = call(func(c context.Context) error {
		_, err := user.Status(c, &catenapb.StatusRequest{Stream: stream})
		return err
	})
	Expect(status.Code(err)).To(Equal(codes.PermissionDenied), "Status as a Stream user: %v", err)
	err = call(func(c context.Context) error {
		_, err := user.Drop(c, &catenapb.DropRequest{Stream: stream, Partition: 0, Epoch: math.MaxUint64, StreamDeleted: true})
		return err
	})
	Expect(status.Code(err)).To(Equal(codes.PermissionDenied), "Drop: %v", err)
	Expect(err.Error()).To(ContainSubstring("may not call /catena.v1.Replica/Drop"))
	GinkgoWriter.Printf("refused: %v\n", err)
	err = call(func(c context.Context) error {
		_, err := user.Truncate(c, &catenapb.TruncateRequest{Stream: stream, Partition: 0, To: 0})
		return err
	})
	Expect(status.Code(err)).To(Equal(codes.PermissionDenied), "Truncate: %v", err)
	err = call(func(c context.Context) error {
		_, err := anonymous.Drop(c, &catenapb.DropRequest{Stream: stream, Partition: 0, Epoch: math.MaxUint64, StreamDeleted: true})
		return err
	})
	Expect(err).To(HaveOccurred(), "a Drop without a client certificate was answered")
	Expect(records()).To(BeNumerically(">=", before), "the refused calls took records away")
}
