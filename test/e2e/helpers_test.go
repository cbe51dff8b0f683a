//go:build e2e

package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// run runs a command and returns its combined output; the command line
// and output go to GinkgoWriter.
func run(name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.kubeconfig)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	GinkgoWriter.Printf("$ %s %s\n%s", filepath.Base(name), strings.Join(args, " "), out.String())
	return out.String(), err
}

// kubectl runs kubectl and fails the spec when it fails.
func kubectl(args ...string) string {
	out, err := run(env.kubectl, args...)
	Expect(err).NotTo(HaveOccurred(), "kubectl %s: %s", strings.Join(args, " "), out)
	return out
}

// kubectlApply applies a manifest from stdin and returns its output and error.
func kubectlApply(ns, manifest string) (string, error) {
	cmd := exec.CommandContext(ctx, env.kubectl, "apply", "-n", ns, "-f", "-")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.kubeconfig)
	cmd.Stdin = strings.NewReader(manifest)
	out, err := cmd.CombinedOutput()
	GinkgoWriter.Printf("$ kubectl apply -n %s -f -\n%s\n%s", ns, manifest, out)
	return string(out), err
}

// since formats the seconds elapsed since t, for timing lines.
func since(t time.Time) string { return fmt.Sprintf("%.1fs", time.Since(t).Seconds()) }

// chains returns the Stream's ReplicationChains by name.
func chains(g Gomega, ns, stream string) map[string]streamsv1alpha1.ReplicationChain {
	var list streamsv1alpha1.ReplicationChainList
	g.Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	out := map[string]streamsv1alpha1.ReplicationChain{}
	for _, c := range list.Items {
		if c.Spec.Stream == stream {
			out[c.Name] = c
		}
	}
	return out
}

// inChain is the number of members of a chain in state InChain.
func inChain(c streamsv1alpha1.ReplicationChain) int {
	n := 0
	for _, m := range c.Status.Members {
		if m.State == streamsv1alpha1.MemberInChain {
			n++
		}
	}
	return n
}

// memberNames are a chain's members, head first.
func memberNames(c streamsv1alpha1.ReplicationChain) []string {
	var out []string
	for _, m := range c.Status.Members {
		out = append(out, m.Name+"("+string(m.State)+")")
	}
	return out
}

// chainConverged: replicationFactor members in chain, every one of them
// at the target epoch, Ready.
func chainConverged(c streamsv1alpha1.ReplicationChain) bool {
	if inChain(c) != int(c.Spec.ReplicationFactor) {
		return false
	}
	for _, m := range c.Status.Members {
		if m.ConfirmedEpoch != c.Status.TargetEpoch {
			return false
		}
	}
	for _, cond := range c.Status.Conditions {
		if cond.Type == streamsv1alpha1.ReplicationChainReadyCondition {
			return cond.Status == metav1.ConditionTrue
		}
	}
	return false
}

// expectStreamReady waits for every partition of the Stream to be ready
// and every chain converged.
func expectStreamReady(ns, name string, partitions int, timeout time.Duration) {
	Eventually(func(g Gomega) {
		var s streamsv1alpha1.Stream
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &s)).To(Succeed())
		g.Expect(s.Status.PartitionsReady).To(BeEquivalentTo(partitions))
		ready := false
		for _, c := range s.Status.Conditions {
			if c.Type == "Ready" {
				ready = c.Status == metav1.ConditionTrue
			}
		}
		g.Expect(ready).To(BeTrue(), "Stream %s Ready: %v", name, s.Status.Conditions)
		cs := chains(g, ns, name)
		g.Expect(cs).To(HaveLen(partitions))
		for _, c := range cs {
			g.Expect(chainConverged(c)).To(BeTrue(), "chain %s: epoch %d members %v conditions %v",
				c.Name, c.Status.TargetEpoch, memberNames(c), c.Status.Conditions)
		}
	}).WithTimeout(timeout).WithPolling(500 * time.Millisecond).Should(Succeed())
}

// replicaPods are the pool's replica pods by name.
func replicaPods(g Gomega, ns, pool string) map[string]corev1.Pod {
	var pods corev1.PodList
	g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{
		"app.kubernetes.io/name": "catena", "app.kubernetes.io/component": "replica", "app.kubernetes.io/instance": pool,
	})).To(Succeed())
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		out[p.Name] = p
	}
	return out
}

// podReady reports whether a pod is Ready and not being deleted.
func podReady(p corev1.Pod) bool { return podCondition(p, corev1.PodReady) }

// replicaUp reports whether a replica pod's process runs and answers:
// its container is ready. The pod's own Ready also waits for the
// operator's chains-ready gate, which holds a returning pod back until
// its chains have it again, so it cannot tell how many replicas are down.
func replicaUp(p corev1.Pod) bool { return podCondition(p, corev1.ContainersReady) }

// podCondition reports whether a pod that is not being deleted has the
// condition typ True.
func podCondition(p corev1.Pod, typ corev1.PodConditionType) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// claimOf is the PersistentVolumeClaim a replica pod mounts as its data.
func claimOf(p corev1.Pod) string {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

// checker is a `catenactl check` pod producing to a Stream through its
// ingestion Service and verifying what it reads back.
type checker struct {
	ns, name string
	started  time.Time
}

// checkReport is the part of catenactl check's JSON report the suite reads.
type checkReport struct {
	Run        string   `json:"run"`
	Sent       int      `json:"sent"`
	Acked      int      `json:"acked"`
	Failed     int      `json:"failed"`
	Found      int      `json:"found"`
	Missing    int      `json:"missing"`
	Duplicates int      `json:"duplicates"`
	Misplaced  int      `json:"misplaced"`
	OutOfOrder int      `json:"out_of_order"`
	OK         bool     `json:"ok"`
	Problems   []string `json:"problems"`
}

// Where a catenactl pod finds its TLS files.
const clientTLSDir = "/etc/catena/client"

// clientSecret is the Secret a client of stream mounts: the client
// certificate of its user, or with user "" the CA bundle alone (a client
// without a certificate of its own).
func clientSecret(stream, user string) string {
	if user == "" {
		return stream + "-ca"
	}
	return stream + "-user-" + user
}

// catenactlPod is a pod that runs catenactl with args once, from the
// suite's image, as the operator's own pods run: non-root, read-only, no
// capabilities. It mounts the TLS Secret tlsSecret (clientSecret), which
// catenactl finds through $CATENA_TLS_CA, and for a user's certificate
// $CATENA_TLS_CERT and $CATENA_TLS_KEY.
func catenactlPod(ns, name, container, tlsSecret string, args []string) *corev1.Pod {
	vars := []corev1.EnvVar{{Name: "CATENA_TLS_CA", Value: clientTLSDir + "/ca.crt"}}
	if !strings.HasSuffix(tlsSecret, "-ca") {
		vars = append(vars, corev1.EnvVar{Name: "CATENA_TLS_CERT", Value: clientTLSDir + "/tls.crt"},
			corev1.EnvVar{Name: "CATENA_TLS_KEY", Value: clientTLSDir + "/tls.key"})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: container, Image: env.image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"/usr/local/bin/catenactl"}, Args: args, Env: vars,
				VolumeMounts: []corev1.VolumeMount{{Name: "tls", MountPath: clientTLSDir, ReadOnly: true}},
				SecurityContext: &corev1.SecurityContext{
					ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
			Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: tlsSecret, DefaultMode: ptr.To[int32](0o444)},
			}}},
		},
	}
}

// startChecker runs catenactl check from the suite's image for duration
// at rate records/s, as user (clientSecret), and waits until it is
// producing.
func startChecker(ns, stream, user, name string, duration time.Duration, rate int) *checker {
	return startCheckerOn("", ns, stream, user, name, duration, rate)
}

// startCheckerOn is startChecker with the checker's pod on node (""
// where the scheduler puts it).
func startCheckerOn(node, ns, stream, user, name string, duration time.Duration, rate int) *checker {
	var s streamsv1alpha1.Stream
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: stream}, &s)).To(Succeed())
	Expect(s.Status.Endpoints.Producers).NotTo(BeEmpty(), "Stream %s has no producer endpoint", stream)
	pod := catenactlPod(ns, name, "check", clientSecret(stream, user), []string{"--server", s.Status.Endpoints.Producers, "check", "--stream", stream,
		"--duration", duration.String(), "--rate", fmt.Sprint(rate), "--keys", "16",
		"--retry-timeout", "2m", "--verify-timeout", "3m"})
	pod.Labels = map[string]string{"app.kubernetes.io/component": "e2e-checker"}
	pod.Spec.NodeName = node
	Expect(k8s.Create(ctx, pod)).To(Succeed())
	c := &checker{ns: ns, name: name, started: time.Now()}
	By("waiting for checker " + name + " to produce")
	Eventually(func(g Gomega) {
		out, err := run(env.kubectl, "logs", "-n", ns, name)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(out).To(ContainSubstring(" sent "))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	GinkgoWriter.Printf("timing: checker %s producing after %s\n", name, since(c.started))
	return c
}

// finish waits for the checker to end and returns its report; it fails
// the spec unless every acknowledged record was found exactly once and in
// order.
func (c *checker) finish(timeout time.Duration) checkReport {
	By("waiting for checker " + c.name + " to verify what it produced")
	var phase corev1.PodPhase
	Eventually(func(g Gomega) {
		var p corev1.Pod
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: c.ns, Name: c.name}, &p)).To(Succeed())
		phase = p.Status.Phase
		g.Expect(phase).To(BeElementOf(corev1.PodSucceeded, corev1.PodFailed))
	}).WithTimeout(timeout).WithPolling(time.Second).Should(Succeed())
	out, err := run(env.kubectl, "logs", "-n", c.ns, c.name)
	Expect(err).NotTo(HaveOccurred())
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var rep checkReport
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "{") {
			Expect(json.Unmarshal([]byte(lines[i]), &rep)).To(Succeed(), "report line %q", lines[i])
			break
		}
	}
	GinkgoWriter.Printf("checker %s after %s: sent %d, acknowledged %d, failed %d, found %d; missing %d, duplicates %d, misplaced %d, out of order %d\n",
		c.name, since(c.started), rep.Sent, rep.Acked, rep.Failed, rep.Found, rep.Missing, rep.Duplicates, rep.Misplaced, rep.OutOfOrder)
	Expect(rep.Run).NotTo(BeEmpty(), "checker %s printed no report (phase %s):\n%s", c.name, phase, out)
	Expect(rep.Acked).To(BeNumerically(">", 0), "checker %s had no record acknowledged", c.name)
	Expect(rep.OK).To(BeTrue(), "checker %s found violations: %v", c.name, rep.Problems)
	Expect(phase).To(Equal(corev1.PodSucceeded))
	return rep
}

// killContainer sends SIGKILL to a container's process through its node's
// containerd (CATENA_E2E_CTR, {node} replaced by the pod's node), from
// outside the container: inside it the
// process is PID 1 and would ignore a SIGKILL from its own namespace (and
// the image has no shell or kill).
func killContainer(p corev1.Pod, container string) {
	var id string
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == container {
			id = s.ContainerID
		}
	}
	Expect(id).To(HavePrefix("containerd://"), "pod %s container %s: %q", p.Name, container, id)
	args := strings.Fields(strings.ReplaceAll(env.ctr, "{node}", p.Spec.NodeName))
	args = append(args, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", strings.TrimPrefix(id, "containerd://"))
	out, err := run(args[0], args[1:]...)
	Expect(err).NotTo(HaveOccurred(), "ctr tasks kill: %s", out)
}

// dumpNamespace prints what a failed spec leaves behind.
func dumpNamespace(ns string) {
	_, _ = run(env.kubectl, "get", "-n", ns, "streams,partitions,replicationchains,pods,pvc,events", "-o", "wide")
	_, _ = run(env.kubectl, "logs", "-n", env.releaseNamespace, "-l", "app.kubernetes.io/component=operator", "--tail", "200")
	_, _ = run(env.kubectl, "logs", "-n", ns, "-l", "app.kubernetes.io/component=replica", "--prefix", "--tail", "80")
	_, _ = run(env.kubectl, "logs", "-n", ns, "-l", "app.kubernetes.io/component=ingest", "--prefix", "--tail", "40")
}
