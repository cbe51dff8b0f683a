package envtest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/catena-streams/catena/controllers"
)

// An operator that dies at a chosen step, and is started again as its
// Deployment would start it: a new process, with nothing of the old one's
// memory. The operator is in this test process (the replicas and workers
// it drives are not), so "dies" means: once the API write of the chosen
// step has landed, the operator makes no further API call, its reconciles
// are cancelled with their calls to replicas and workers, and its manager
// stops without releasing its lease, as SIGKILL would leave it.

// errOperatorKilled is what a killed operator's API calls return.
var errOperatorKilled = errors.New("the operator was killed")

// operatorSupervisor runs one operator run at a time (or, with leader
// election, several contending runs), restarting a run that was killed.
type operatorSupervisor struct {
	opts       controllers.Options
	namespaces []string
	// leaderElection, when set, has the runs contend for a Lease in the
	// first namespace, with short timings.
	leaderElection bool

	mu       sync.Mutex
	runs     []*operatorRun
	killAt   func(client.Object) bool
	kills    int
	stopping bool
	wg       sync.WaitGroup
}

// operatorRun is one process of the operator.
type operatorRun struct {
	name    string
	killed  atomic.Bool
	cancel  context.CancelFunc
	elected <-chan struct{}
	done    chan struct{}
}

// superviseOperator starts replicas runs of the operator (2 or more only
// with leaderElection), each restarted after it is killed, until the
// calling container or spec ends.
func superviseOperator(opts controllers.Options, leaderElection bool, replicas int, namespaces ...string) *operatorSupervisor {
	ctrl.SetLogger(GinkgoLogr)
	SetDefaultEventuallyTimeout(operatorTimeout)
	SetDefaultEventuallyPollingInterval(50 * time.Millisecond)
	s := &operatorSupervisor{opts: opts, namespaces: namespaces, leaderElection: leaderElection}
	for i := range replicas {
		s.start(fmt.Sprintf("operator-%d", i))
	}
	DeferCleanup(func() {
		s.mu.Lock()
		s.stopping = true
		runs := s.runs
		s.mu.Unlock()
		for _, r := range runs {
			r.cancel()
		}
		done := make(chan struct{})
		go func() { s.wg.Wait(); close(done) }()
		Eventually(done).WithTimeout(30*time.Second).Should(BeClosed(), "the operators did not stop")
		SetDefaultEventuallyTimeout(time.Second)
		SetDefaultEventuallyPollingInterval(10 * time.Millisecond)
	})
	return s
}

// killAfter arms a kill: the first API write of any run whose stored result
// matches at dies with the run, after it landed.
func (s *operatorSupervisor) killAfter(at func(client.Object) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killAt = at
}

// killed is how many runs have been killed.
func (s *operatorSupervisor) killed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kills
}

// leader is the run that holds the lease, if one does.
func (s *operatorSupervisor) leader() *operatorRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.runs {
		select {
		case <-r.elected:
			if !r.killed.Load() {
				return r
			}
		default:
		}
	}
	return nil
}

// killNow kills run r at whatever step it is in.
func (s *operatorSupervisor) killNow(r *operatorRun) {
	s.kill(r, "killed at once")
}

// afterWrite is called with each landed write of run r.
func (s *operatorSupervisor) afterWrite(r *operatorRun, obj client.Object) {
	s.mu.Lock()
	at := s.killAt
	s.mu.Unlock()
	if at == nil || !at(obj) {
		return
	}
	s.mu.Lock()
	if s.killAt == nil { // another write matched first
		s.mu.Unlock()
		return
	}
	s.killAt = nil
	s.mu.Unlock()
	s.kill(r, fmt.Sprintf("killed right after writing %T %s", obj, obj.GetName()))
}

func (s *operatorSupervisor) kill(r *operatorRun, why string) {
	if r.killed.Swap(true) {
		return
	}
	GinkgoWriter.Printf("%s %s: %s\n", time.Now().Format("15:04:05.000"), r.name, why)
	r.cancel()
	s.mu.Lock()
	s.kills++
	s.mu.Unlock()
}

// start runs a new process of the operator under name; once it is killed
// and stopped, a new one starts under the same name, as a restarted pod.
func (s *operatorSupervisor) start(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return
	}
	r := &operatorRun{name: name, done: make(chan struct{})}
	opts := managerOptions(s.namespaces...)
	opts.NewClient = func(cfg *rest.Config, o client.Options) (client.Client, error) {
		c, err := client.New(cfg, o)
		if err != nil {
			return nil, err
		}
		return &killableClient{Client: c, run: r, wrote: s.afterWrite}, nil
	}
	if s.leaderElection {
		opts.LeaderElection = true
		opts.LeaderElectionID = "catena-operator.streams.catena.io"
		opts.LeaderElectionNamespace = s.namespaces[0]
		// A killed leader does not release its lease: the next one takes
		// over when it expires.
		opts.LeaderElectionReleaseOnCancel = false
		lease, renew, retry := 3*time.Second, 2*time.Second, 500*time.Millisecond
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &lease, &renew, &retry
	}
	mgr, err := ctrl.NewManager(testEnv.Config, opts)
	Expect(err).NotTo(HaveOccurred())
	r.elected = mgr.Elected()
	mctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	Expect(controllers.SetupWithManager(mctx, mgr, s.opts)).To(Succeed())
	s.runs = append(s.runs, r)
	s.wg.Add(1)
	go func() {
		defer GinkgoRecover()
		defer s.wg.Done()
		defer close(r.done)
		if err := mgr.Start(mctx); err != nil && !r.killed.Load() {
			GinkgoWriter.Printf("%s stopped: %v\n", name, err)
		}
		if !r.killed.Load() {
			return
		}
		// A restarted pod: a new process after a back-off. With leader
		// election the back-off outlasts the lease, so that the standby
		// is the one that takes over.
		backoff := 200 * time.Millisecond
		if s.leaderElection {
			backoff = 5 * time.Second
		}
		time.Sleep(backoff)
		s.start(name)
	}()
}

// killableClient is a run's API client: it refuses every call once the
// run is killed, and tells the supervisor of each write that landed.
type killableClient struct {
	client.Client
	run   *operatorRun
	wrote func(*operatorRun, client.Object)
}

func (c *killableClient) alive() error {
	if c.run.killed.Load() {
		return errOperatorKilled
	}
	return nil
}

func (c *killableClient) landed(obj client.Object, err error) error {
	if err != nil {
		return err
	}
	c.wrote(c.run, obj)
	return c.alive()
}

func (c *killableClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *killableClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.Client.List(ctx, list, opts...)
}

func (c *killableClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.landed(obj, c.Client.Create(ctx, obj, opts...))
}

func (c *killableClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.landed(obj, c.Client.Update(ctx, obj, opts...))
}

func (c *killableClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.landed(obj, c.Client.Patch(ctx, obj, patch, opts...))
}

func (c *killableClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *killableClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.landed(obj, c.Client.Delete(ctx, obj, opts...))
}

func (c *killableClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	if err := c.alive(); err != nil {
		return err
	}
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

func (c *killableClient) Status() client.SubResourceWriter {
	return &killableStatus{SubResourceWriter: c.Client.Status(), c: c}
}

func (c *killableClient) SubResource(sub string) client.SubResourceClient {
	if sub == "status" {
		return &killableSubResource{SubResourceClient: c.Client.SubResource(sub), c: c}
	}
	return c.Client.SubResource(sub)
}

// killableStatus is a run's status writer.
type killableStatus struct {
	client.SubResourceWriter
	c *killableClient
}

func (w *killableStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := w.c.alive(); err != nil {
		return err
	}
	return w.c.landed(obj, w.SubResourceWriter.Update(ctx, obj, opts...))
}

func (w *killableStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := w.c.alive(); err != nil {
		return err
	}
	return w.c.landed(obj, w.SubResourceWriter.Patch(ctx, obj, patch, opts...))
}

// killableSubResource is a run's status client.
type killableSubResource struct {
	client.SubResourceClient
	c *killableClient
}

func (w *killableSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := w.c.alive(); err != nil {
		return err
	}
	return w.c.landed(obj, w.SubResourceClient.Update(ctx, obj, opts...))
}

func (w *killableSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := w.c.alive(); err != nil {
		return err
	}
	return w.c.landed(obj, w.SubResourceClient.Patch(ctx, obj, patch, opts...))
}
