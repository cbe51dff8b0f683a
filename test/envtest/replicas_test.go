package envtest_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// Real `catena replica` processes stand in for the replica pods that
// envtest cannot run: the operator reaches them through a ReplicaAddr that
// maps each pod name to the process playing it.

var (
	catenaBinOnce sync.Once
	catenaBinPath string
)

// catenaBinary builds cmd/catena once per suite run.
func catenaBinary() string {
	catenaBinOnce.Do(func() {
		// Removed by AfterSuite.
		dir, err := os.MkdirTemp("", "catena-envtest-bin-")
		Expect(err).NotTo(HaveOccurred())
		catenaBinPath = filepath.Join(dir, "catena")
		cmd := exec.Command("go", "build", "-o", catenaBinPath, "github.com/catena-streams/catena/cmd/catena")
		cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
		Expect(cmd.Run()).To(Succeed(), "building catena failed; its output is above")
	})
	return catenaBinPath
}

// replicaProcess is one `catena replica` playing a pod.
type replicaProcess struct {
	id, addr, dataDir, logPath string
	cmd                        *exec.Cmd
	done                       chan struct{}

	connOnce sync.Once
	conn     *grpc.ClientConn
}

// procSet is the processes playing pods of one kind, by namespace/pod.
// Its directory holds their data and logs; it lives as long as the set (a
// spec's TempDir would vanish under a process that outlives the spec).
type procSet[P interface{ stop() }] struct {
	dir   string
	mu    sync.Mutex
	procs map[string]P
}

// newProcSet makes a set whose processes stop, and whose directory is
// removed, when the calling container or spec ends.
func newProcSet[P interface{ stop() }](prefix string) *procSet[P] {
	dir, err := os.MkdirTemp("", prefix)
	Expect(err).NotTo(HaveOccurred())
	ps := &procSet[P]{dir: dir, procs: map[string]P{}}
	DeferCleanup(func() {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		for _, p := range ps.procs {
			p.stop()
		}
		_ = os.RemoveAll(ps.dir)
	})
	return ps
}

// replicaSet is the processes playing the pods of pools.
type replicaSet struct{ *procSet[*replicaProcess] }

func newReplicaSet() *replicaSet {
	return &replicaSet{newProcSet[*replicaProcess]("catena-envtest-replicas-")}
}

// addr is the operator's ReplicaAddr: the process playing the pod, or an
// address nothing listens on.
func (rs *replicaSet) addr(pool *streamsv1alpha1.ReplicaPool, pod string) string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if p := rs.procs[pool.Namespace+"/"+pod]; p != nil {
		return p.addr
	}
	return "127.0.0.1:1"
}

func (rs *replicaSet) get(ns, pod string) *replicaProcess {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.procs[ns+"/"+pod]
}

// start runs a replica for pod ns/pod on a free loopback port, on the data
// directory it had before when it ran already, with the extra flags args,
// and waits until it answers.
func (rs *replicaSet) start(ns, pod string, args ...string) *replicaProcess {
	rs.mu.Lock()
	prev := rs.procs[ns+"/"+pod]
	rs.mu.Unlock()
	p := &replicaProcess{id: pod, addr: freeAddr()}
	if prev != nil {
		p.dataDir, p.logPath = prev.dataDir, prev.logPath
	} else {
		p.dataDir = filepath.Join(rs.dir, ns, pod)
		p.logPath = p.dataDir + ".log"
	}
	Expect(os.MkdirAll(p.dataDir, 0o755)).To(Succeed())
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	Expect(err).NotTo(HaveOccurred())
	p.cmd = exec.Command(catenaBinary(), append([]string{"replica", "--id", pod, "--listen", p.addr, "--data-dir", p.dataDir}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	// Safety net only: a test binary that dies must not leave servers behind.
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
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			GinkgoWriter.Printf("---- %s (tail)\n%s\n", p.logPath, b)
		}
	})
	rc := p.client()
	Eventually(func() error {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := rc.Status(cctx, &catenapb.StatusRequest{})
		return err
	}).WithTimeout(30*time.Second).Should(Succeed(), "replica %s did not answer", pod)
	rs.mu.Lock()
	rs.procs[ns+"/"+pod] = p
	rs.mu.Unlock()
	return p
}

// client is a client of the replica's admin API; the connection closes
// when the process stops.
func (p *replicaProcess) client() catenapb.ReplicaClient {
	p.connOnce.Do(func() {
		var err error
		p.conn, err = grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		Expect(err).NotTo(HaveOccurred())
	})
	return catenapb.NewReplicaClient(p.conn)
}

func (p *replicaProcess) closeConn() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
}

// kill stops the process with SIGKILL, as a node or OOM kill would.
func (p *replicaProcess) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	Eventually(p.done).WithTimeout(10 * time.Second).Should(BeClosed())
	p.closeConn()
}

// pause stops the process (SIGSTOP) without killing it, as a long GC pause,
// a frozen VM or a partition would; resume lets it go on.
func (p *replicaProcess) pause() {
	ExpectWithOffset(1, p.cmd.Process.Signal(syscall.SIGSTOP)).To(Succeed())
}
func (p *replicaProcess) resume() {
	ExpectWithOffset(1, p.cmd.Process.Signal(syscall.SIGCONT)).To(Succeed())
}

// stop sends SIGTERM, escalating to SIGKILL.
func (p *replicaProcess) stop() {
	select {
	case <-p.done:
		p.closeConn()
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused process cannot handle SIGTERM
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		p.closeConn()
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

// hosted is what the replica reports of stream: its partitions by index.
func (p *replicaProcess) hosted(stream string) (map[uint32]*catenapb.PartitionStatus, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := p.client().Status(cctx, &catenapb.StatusRequest{Stream: stream})
	if err != nil {
		return nil, err
	}
	out := map[uint32]*catenapb.PartitionStatus{}
	for _, ps := range resp.GetPartitions() {
		out[ps.GetPartition()] = ps
	}
	return out, nil
}

// startIngest runs `catena ingest` on a free loopback port, discovering
// chains from replicas, until the calling container or spec ends.
func startIngest(replicas []string) string {
	addr := freeAddr()
	logPath := filepath.Join(os.TempDir(), fmt.Sprintf("catena-envtest-ingest-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command(catenaBinary(), "ingest", "--listen", addr, "--replicas", strings.Join(replicas, ","))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	Expect(cmd.Start()).To(Succeed())
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(done)
	}()
	DeferCleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if CurrentSpecReport().Failed() {
			b, _ := os.ReadFile(logPath)
			GinkgoWriter.Printf("---- %s\n%s\n", logPath, b)
		}
		_ = os.Remove(logPath)
	})
	return addr
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().String()
}

// startManager runs a controller manager of its own, with the
// controllers setup registers, watching only namespaces (the API
// validation specs elsewhere in the suite create objects no controller
// should touch), until the calling container or spec ends. It also gives
// Eventually the operator's patience: the manager starts its informers and
// reconciles on a machine shared with other work, under -race.
func startManager(setup func(context.Context, ctrl.Manager) error, namespaces ...string) ctrl.Manager {
	return startManagerWithConfig(testEnv.Config, setup, namespaces...)
}

// startManagerWithConfig is startManager with the manager talking to the
// API server through cfg.
func startManagerWithConfig(cfg *rest.Config, setup func(context.Context, ctrl.Manager) error, namespaces ...string) ctrl.Manager {
	// The controllers' logs show with a failing spec's output.
	ctrl.SetLogger(GinkgoLogr)
	SetDefaultEventuallyTimeout(operatorTimeout)
	SetDefaultEventuallyPollingInterval(50 * time.Millisecond)
	DeferCleanup(func() {
		SetDefaultEventuallyTimeout(time.Second)
		SetDefaultEventuallyPollingInterval(10 * time.Millisecond)
	})
	mgr, err := ctrl.NewManager(cfg, managerOptions(namespaces...))
	Expect(err).NotTo(HaveOccurred())
	mgrCtx, stop := context.WithCancel(ctx)
	Expect(setup(mgrCtx, mgr)).To(Succeed())
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(mgr.Start(mgrCtx)).To(Succeed())
	}()
	DeferCleanup(func() {
		stop()
		Eventually(done).WithTimeout(30*time.Second).Should(BeClosed(), "the manager did not stop")
	})
	return mgr
}

// managerOptions are the options of the suite's managers: no metrics or
// probe servers, a cache of namespaces only.
func managerOptions(namespaces ...string) ctrl.Options {
	defaults := map[string]cache.Config{}
	for _, ns := range namespaces {
		defaults[ns] = cache.Config{}
	}
	return ctrl.Options{
		Scheme:                 k8s.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultNamespaces: defaults},
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}
}

// startOperator runs every controller of the operator (startManager).
func startOperator(opts controllers.Options, namespaces ...string) {
	startManager(func(ctx context.Context, mgr ctrl.Manager) error {
		return controllers.SetupWithManager(ctx, mgr, opts)
	}, namespaces...)
}

// chainsOf reads the ReplicationChains of a stream, by partition.
func chainsOf(g Gomega, ns, stream string, n int) []streamsv1alpha1.ReplicationChain {
	out := make([]streamsv1alpha1.ReplicationChain, n)
	for i := range n {
		g.Expect(k8s.Get(ctx, key(ns, streamsv1alpha1.PartitionName(stream, int32(i))), &out[i])).To(Succeed())
	}
	return out
}

// expectChainsInstalled asserts that every chain of stream is placed, that
// every member confirmed the chain's epoch, and that the replica processes
// run exactly that membership.
func expectChainsInstalled(g Gomega, replicas *replicaSet, ns, stream string, n, rf int) []streamsv1alpha1.ReplicationChain {
	cs := chainsOf(g, ns, stream, n)
	for i := range cs {
		c := &cs[i]
		g.Expect(c.Status.Members).To(HaveLen(rf), describeChain(c))
		g.Expect(meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainReadyCondition)).To(BeTrue(), describeChain(c))
		var want []string
		for _, m := range c.Status.Members {
			g.Expect(m.State).To(Equal(streamsv1alpha1.MemberInChain), describeChain(c))
			g.Expect(m.ConfirmedEpoch).To(Equal(c.Status.TargetEpoch), describeChain(c))
			want = append(want, m.Name)
		}
		for _, m := range c.Status.Members {
			hosted, err := replicas.get(ns, m.Name).hosted(stream)
			g.Expect(err).NotTo(HaveOccurred())
			ps := hosted[uint32(*c.Spec.Partition)]
			g.Expect(ps).NotTo(BeNil(), "%s does not host %s", m.Name, c.Name)
			g.Expect(ps.GetEpoch()).To(Equal(uint64(c.Status.TargetEpoch)), "%s's epoch of %s", m.Name, c.Name)
			var got []string
			for _, pm := range ps.GetMembers() {
				got = append(got, pm.GetId())
			}
			g.Expect(got).To(Equal(want), "%s's membership of %s", m.Name, c.Name)
		}
	}
	return cs
}

// appendRecords writes n records to a chain's partition through its head,
// each of size bytes at least, and returns once the tail completed them.
func appendRecords(replicas *replicaSet, ns string, c streamsv1alpha1.ReplicationChain, n, size int) {
	GinkgoHelper()
	recs := make([]*catenapb.AppendRecord, n)
	for i := range recs {
		v := []byte(fmt.Sprintf("r%d", i))
		if len(v) < size {
			v = append(v, make([]byte, size-len(v))...)
		}
		recs[i] = &catenapb.AppendRecord{Value: v}
	}
	actx, cancelAppend := context.WithTimeout(ctx, 10*time.Second)
	defer cancelAppend()
	_, err := replicas.get(ns, c.Head()).client().Append(actx, &catenapb.AppendRequest{
		Stream: c.Spec.Stream, Partition: uint32(*c.Spec.Partition), Epoch: uint64(c.Status.TargetEpoch), Records: recs})
	Expect(err).NotTo(HaveOccurred(), "append to %s", c.Name)
}

// describeChain renders a chain's status for failure messages.
func describeChain(c *streamsv1alpha1.ReplicationChain) string {
	s := fmt.Sprintf("%s epoch %d:", c.Name, c.Status.TargetEpoch)
	for _, m := range c.Status.Members {
		s += fmt.Sprintf(" %s(%s,%d)", m.Name, m.State, m.ConfirmedEpoch)
	}
	return s
}
