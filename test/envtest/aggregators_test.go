package envtest_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// Real `catena aggregator` processes stand in for the worker pods of
// Aggregations, as replica processes do for replica pods: the operator
// reaches them through a WorkerAddr that maps each pod to its process.

// workerProcess is one `catena aggregator` playing a pod.
type workerProcess struct {
	id, addr, logPath string
	cmd               *exec.Cmd
	done              chan struct{}
	conn              *grpc.ClientConn
}

// workerSet is the processes playing worker pods.
type workerSet struct{ *procSet[*workerProcess] }

func newWorkerSet() *workerSet {
	return &workerSet{newProcSet[*workerProcess]("catena-envtest-aggregators-")}
}

// addr is the operator's WorkerAddr: the process playing the pod, or an
// address nothing listens on.
func (ws *workerSet) addr(pod *corev1.Pod) string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if p := ws.procs[pod.Namespace+"/"+pod.Name]; p != nil {
		return p.addr
	}
	return "127.0.0.1:1"
}

func (ws *workerSet) get(ns, pod string) *workerProcess {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.procs[ns+"/"+pod]
}

// start runs an aggregator for pod ns/pod on a free loopback port, reading
// through ingest, and waits until it answers.
func (ws *workerSet) start(ns, pod, ingest string) *workerProcess {
	p := &workerProcess{id: pod, addr: freeAddr(), logPath: filepath.Join(ws.dir, ns+"-"+pod+".log")}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	Expect(err).NotTo(HaveOccurred())
	p.cmd = exec.Command(catenaBinary(), "aggregator", "--id", pod, "--listen", p.addr, "--ingest", ingest)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	Expect(p.cmd.Start()).To(Succeed())
	p.done = make(chan struct{})
	go func() {
		_ = p.cmd.Wait()
		_ = logf.Close()
		close(p.done)
	}()
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			b, _ := os.ReadFile(p.logPath)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			GinkgoWriter.Printf("---- %s (tail)\n%s\n", p.logPath, b)
		}
	})
	p.conn, err = grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() error {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := p.client().Status(cctx, &catenapb.AggregatorStatusRequest{})
		return err
	}).WithTimeout(30*time.Second).Should(Succeed(), "aggregator %s did not answer", pod)
	ws.mu.Lock()
	ws.procs[ns+"/"+pod] = p
	ws.mu.Unlock()
	return p
}

func (p *workerProcess) client() catenapb.AggregatorClient {
	return catenapb.NewAggregatorClient(p.conn)
}

// kill stops the process with SIGKILL, as a node or OOM kill would.
func (p *workerProcess) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	Eventually(p.done).WithTimeout(10 * time.Second).Should(BeClosed())
	_ = p.conn.Close()
}

// stop sends SIGTERM, escalating to SIGKILL.
func (p *workerProcess) stop() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	_ = p.conn.Close()
}

// createWorkerPod creates the pod the StatefulSet would have made for a
// worker of the Aggregation agg, Running and Ready as the kubelet would
// report it (envtest runs neither).
func createWorkerPod(ns, agg, pod string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, Labels: map[string]string{
			"app.kubernetes.io/name":        "catena",
			"app.kubernetes.io/component":   "aggregator",
			"app.kubernetes.io/instance":    agg + "-aggregator",
			"streams.catena.io/aggregation": agg,
		}},
		Spec: corev1.PodSpec{Subdomain: agg + "-aggregator", Containers: []corev1.Container{{Name: "aggregator", Image: testImage}}},
	}
	Expect(k8s.Create(ctx, p)).To(Succeed())
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{
		Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(),
	}}}
	Expect(k8s.Status().Update(ctx, p)).To(Succeed())
	return p
}
