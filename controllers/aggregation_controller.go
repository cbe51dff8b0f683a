package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// AggregationFinalizer holds a deleted Aggregation until its consumer's
// retention holds on the source and checkpoint streams are released.
const AggregationFinalizer = "streams.catena.io/retention-holds"

// WorkerAddrFunc returns the address at which the operator, and the other
// workers, reach an aggregator worker pod.
type WorkerAddrFunc func(pod *corev1.Pod) string

// IngestAddrFunc returns the ingestion address workers read a source Stream
// and write its Aggregation's checkpoints through ("" leaves it to the
// worker's --ingest flag).
type IngestAddrFunc func(source *streamsv1alpha1.Stream) string

// Timing of the Aggregation controller.
const (
	// aggBusyInterval is the next look at an Aggregation whose shards are
	// moving or restoring.
	aggBusyInterval = 500 * time.Millisecond
	// maxAggProbeInterval bounds the time between probes of a settled
	// Aggregation's workers; it is also at most a quarter of
	// failureTimeout, so that a silent worker is noticed in time.
	maxAggProbeInterval = 2 * time.Second
	// stalledBench is how many failure timeouts a stalled worker is given
	// no shards for: without shards it shows no lack of progress, and
	// balance alone would hand its shards straight back.
	stalledBench = 3
)

// aggSourceIndex indexes Aggregations by their source Stream.
const aggSourceIndex = "streams.catena.io/aggregationSource"

// AggregationReconciler runs Aggregations: it creates the checkpoint Stream
// and the workers, decides which worker owns which shard (a source
// partition) with planAssignment, writes that to status before pushing it
// to the workers (Aggregator.Assign), probes the workers
// (Aggregator.Status) to fill status and notice failed or stalled ones,
// records restorations, and on deletion releases the Aggregation's
// retention holds on the replicas.
type AggregationReconciler struct {
	Client client.Client
	Scheme *runtime.Scheme
	// Image is the container image of worker pods, the operator's own.
	Image string
	// ImagePullSecrets are added to every pod it runs (the chart's
	// imagePullSecrets).
	ImagePullSecrets []string
	// Recorder records Events on Aggregations (nil: none).
	Recorder events.EventRecorder
	// Conns dials workers and replicas.
	Conns *transport.Pool
	// ReplicaAddr reaches replicas (to release retention holds);
	// WorkerAddr reaches workers (nil: WorkerDNSAddr); IngestAddr says
	// which ingestion address workers use (nil: the source Stream's
	// status.endpoints.producers).
	ReplicaAddr ReplicaAddrFunc
	WorkerAddr  WorkerAddrFunc
	IngestAddr  IngestAddrFunc
	// Certificates, when set, issues the workers' certificate and runs
	// them with mutual TLS (nil: plaintext).
	Certificates CertificateIssuer
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	// workers probe each Aggregation's workers outside the reconciles.
	workers *workerObservers

	mu sync.Mutex
	// memory of each Aggregation, by namespace/name.
	memory map[types.NamespacedName]*aggMemory
}

// aggMemory is what the operator remembers of one Aggregation between
// rounds besides its workers' probes (workerObservers): each shard's
// progress, which its stall verdicts are drawn from. Both are evidence,
// lost with the operator, which costs at most a failure timeout of
// patience: a new operator (after a restart, or a new leader) counts a
// worker's silence and a shard's lack of progress from its own first look.
// What it decided is in status (assignments, restoring, benched), written
// before it acts. Only reconciles of its Aggregation touch it, and the work
// queue never runs two of one key at once.
type aggMemory struct {
	progress map[int32]shardProgress
}

func (r *AggregationReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *AggregationReconciler) memoryOf(key types.NamespacedName) *aggMemory {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.memory == nil {
		r.memory = map[types.NamespacedName]*aggMemory{}
	}
	m := r.memory[key]
	if m == nil {
		m = &aggMemory{progress: map[int32]shardProgress{}}
		r.memory[key] = m
	}
	return m
}

func (r *AggregationReconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.memory, key)
	if r.workers != nil {
		r.workers.forget(key)
	}
}

func (r *AggregationReconciler) event(agg *streamsv1alpha1.Aggregation, eventType, reason, action, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(agg, nil, eventType, reason, action, note, args...)
	}
}

// +kubebuilder:rbac:groups=streams.catena.io,resources=aggregations,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=streams.catena.io,resources=aggregations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=streams.catena.io,resources=aggregations/finalizers,verbs=update
// The checkpoint Stream is created and owned by its Aggregation.
// +kubebuilder:rbac:groups=streams.catena.io,resources=streams,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=streams.catena.io,resources=replicapools;replicationchains,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// aggScope is what one round of one Aggregation works with.
type aggScope struct {
	agg     *streamsv1alpha1.Aggregation
	source  *streamsv1alpha1.Stream
	mem     *aggMemory
	now     time.Time
	timeout time.Duration
	obs     aggObservation
	// pods are the worker pods by name; addrs their addresses.
	pods  map[string]*corev1.Pod
	addrs map[string]string
	// reports are this round's Status answers by worker; states the
	// workers' states.
	reports map[string]*catenapb.AggregatorStatus
	states  map[string]workerState
	plan    assignmentPlan
	// restored are the restorations finished this round, to record.
	restored []streamsv1alpha1.AggregationRestoration
	// before is the Aggregation as stored: as read, then as written with
	// a new assignment. The final status patch is relative to it.
	before *streamsv1alpha1.Aggregation
	// stale is set when the Aggregation read was older than the stored
	// one: nothing is recorded, the change that made it so brings the
	// next round.
	stale bool
	// requeue, when set, is the next look of a round that decided
	// nothing: it waits for its workers' first probes.
	requeue time.Duration
	// workers are the Aggregation's worker probes.
	workers *observedWorkers
}

// Reconcile takes one step of one Aggregation.
func (r *AggregationReconciler) Reconcile(ctx context.Context, req reconcile.Request) (_ reconcile.Result, retErr error) {
	logger := log.FromContext(ctx).WithValues("aggregation", req.NamespacedName)
	ctx = log.IntoContext(ctx, logger)

	agg := &streamsv1alpha1.Aggregation{}
	if err := r.Client.Get(ctx, req.NamespacedName, agg); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !agg.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, agg)
	}
	if !controllerutil.ContainsFinalizer(agg, AggregationFinalizer) {
		before := agg.DeepCopy()
		controllerutil.AddFinalizer(agg, AggregationFinalizer)
		if err := r.Client.Patch(ctx, agg, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("failed to add the finalizer of Aggregation %s: %w", agg.Name, err))
		}
		return reconcile.Result{}, nil
	}

	s := &aggScope{agg: agg, mem: r.memoryOf(req.NamespacedName), now: r.now(), timeout: agg.Spec.FailureTimeout.Duration}
	if s.timeout <= 0 {
		s.timeout = 10 * time.Second // the schema's default
	}
	s.before = agg.DeepCopy()
	defer func() {
		if retErr != nil || s.stale {
			return // what was gathered is partial; the retry records status
		}
		agg.Status = aggregationStatus(agg, s.obs)
		if !equality.Semantic.DeepEqual(s.before.Status, agg.Status) {
			if err := r.Client.Status().Patch(ctx, agg, client.MergeFromWithOptions(s.before, client.MergeFromWithOptimisticLock{})); err != nil {
				if apierrors.IsConflict(err) {
					// Read from a cache behind the last write: the
					// restorations seen stay pending and are seen again.
					logger.V(1).Info("The Aggregation changed meanwhile; recording status on its next version")
					return
				}
				retErr = kerrors.NewAggregate([]error{retErr, fmt.Errorf("failed to patch the status of Aggregation %s: %w", agg.Name, err)})
				return
			}
		}
		r.restorationsRecorded(ctx, s)
	}()

	phases := []struct {
		name string
		run  func(context.Context, *aggScope) (bool, error)
	}{
		{"read the source Stream", r.readSource},
		{"apply the Aggregation's objects", r.applyObjects},
		{"probe the workers", r.probeWorkers},
		{"plan the assignment", r.planAndRecord},
		{"push the assignment", r.pushAssignments},
		{"record the shards", r.recordShards},
	}
	for _, p := range phases {
		cont, err := p.run(ctx, s)
		if err != nil {
			return reconcile.Result{}, fmt.Errorf("failed to %s of Aggregation %s: %w", p.name, agg.Name, err)
		}
		if !cont {
			return reconcile.Result{RequeueAfter: s.requeue}, nil
		}
	}
	return reconcile.Result{RequeueAfter: r.nextLook(s)}, nil
}

// nextLook is when to probe again: soon while shards move or restore,
// otherwise often enough to notice a silent worker within failureTimeout.
func (r *AggregationReconciler) nextLook(s *aggScope) time.Duration {
	if len(s.agg.Status.Restoring) > 0 || len(s.plan.Moves) > 0 || !shardsRunning(s.agg.Status.Shards) {
		return aggBusyInterval
	}
	return min(maxAggProbeInterval, max(aggBusyInterval, s.timeout/4))
}

func shardsRunning(shards []streamsv1alpha1.AggregationShardStatus) bool {
	for _, sh := range shards {
		if sh.Phase != "Running" {
			return false
		}
	}
	return len(shards) > 0
}

// readSource reads the source Stream; without it there is nothing to do
// until it appears (its creation wakes the Aggregation).
func (r *AggregationReconciler) readSource(ctx context.Context, s *aggScope) (bool, error) {
	src := &streamsv1alpha1.Stream{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: s.agg.Namespace, Name: s.agg.Spec.Source}, src)
	switch {
	case apierrors.IsNotFound(err):
		log.FromContext(ctx).Info("Source Stream not found", "stream", s.agg.Spec.Source, "reason", streamsv1alpha1.AggregationSourceNotFoundReason)
		return false, nil
	case err != nil:
		return false, err
	}
	s.source = src
	s.obs.SourceFound = true
	return true, nil
}

// applyObjects applies the checkpoint Stream, the workers' StatefulSet,
// Services and PodDisruptionBudget, each only when what the operator would
// apply changed (or it is missing), and reads what they report.
func (r *AggregationReconciler) applyObjects(ctx context.Context, s *aggScope) (bool, error) {
	want := desiredAggregationObjects(s.agg, s.source, r.Image)
	addImagePullSecrets(&want.Workers.Spec.Template.Spec, r.ImagePullSecrets)
	if c := r.Certificates; c != nil {
		// Renewals are seen at the next look (at most
		// maxAggProbeInterval away).
		if _, err := c.ensureLeaf(ctx, s.agg, s.agg.TLSSecretName(), workersLeaf(s.agg), nil); err != nil {
			return false, err
		}
		mountTLS(&want.Workers.Spec.Template.Spec, s.agg.TLSSecretName(), c.podArgs(workerAccessArgs(s.agg, s.source, c.OperatorIdentity())...)...)
	}
	cp := &streamsv1alpha1.Stream{}
	ours, err := r.applyChanged(ctx, s.agg, want.Checkpoints, cp)
	if err != nil {
		return false, err
	}
	if !ours && cp.Name != "" {
		// Workers must not write checkpoints into someone else's Stream.
		s.obs.Conflict = "Stream " + cp.Name
		return false, nil
	}
	s.obs.CheckpointsReady = cp.IsReady()
	sts := &appsv1.StatefulSet{}
	found, err := r.applyChanged(ctx, s.agg, want.Workers, sts)
	if err != nil {
		return false, err
	}
	s.obs.WorkersFound = found
	if _, err := r.applyChanged(ctx, s.agg, want.Headless, &corev1.Service{}); err != nil {
		return false, err
	}
	if _, err := r.applyChanged(ctx, s.agg, want.Service, &corev1.Service{}); err != nil {
		return false, err
	}
	if _, err := r.applyChanged(ctx, s.agg, want.PDB, &policyv1.PodDisruptionBudget{}); err != nil {
		return false, err
	}
	return true, nil
}

// applyChanged reads desired's namesake into current and applies desired
// when it is missing or was last applied from something else. An object
// of that name the Aggregation does not control is left alone, and so
// reported as not found.
func (r *AggregationReconciler) applyChanged(ctx context.Context, agg *streamsv1alpha1.Aggregation, desired, current client.Object) (bool, error) {
	hash, err := stampHash(desired)
	if err != nil {
		return false, err
	}
	err = r.Client.Get(ctx, client.ObjectKeyFromObject(desired), current)
	switch {
	case apierrors.IsNotFound(err):
		log.FromContext(ctx).Info("Creating the Aggregation's "+kindOf(desired), "name", desired.GetName())
	case err != nil:
		return false, fmt.Errorf("failed to read %s %s: %w", kindOf(desired), desired.GetName(), err)
	case !metav1.IsControlledBy(current, agg):
		log.FromContext(ctx).Info("The name of an Aggregation's object is taken", "object", kindOf(desired)+" "+desired.GetName())
		return false, nil
	case appliedAlready(current, hash):
		return true, nil
	}
	if err := applyOwned(ctx, r.Client, r.Scheme, agg, desired); err != nil {
		return false, err
	}
	return true, nil
}

// probeWorkers reads the worker pods and their latest answers (the
// workers' observer asks them, outside the reconcile), and decides each
// worker's state. It decides nothing until every worker has been asked.
func (r *AggregationReconciler) probeWorkers(ctx context.Context, s *aggScope) (bool, error) {
	var list corev1.PodList
	if err := r.Client.List(ctx, &list, client.InNamespace(s.agg.Namespace), client.MatchingLabels(aggSelectorLabels(s.agg))); err != nil {
		return false, fmt.Errorf("failed to list the worker pods: %w", err)
	}
	addrOf := r.WorkerAddr
	if addrOf == nil {
		addrOf = WorkerDNSAddr
	}
	s.pods = map[string]*corev1.Pod{}
	for i := range list.Items {
		s.pods[list.Items[i].Name] = &list.Items[i]
	}
	s.addrs = runnableWorkerAddrs(list.Items, addrOf)
	s.workers = r.workers.workers(client.ObjectKeyFromObject(s.agg), s.timeout, s.addrs)
	view := s.workers.view(s.now)
	if !view.Complete {
		// A worker not asked yet is not a silent one.
		s.stale, s.requeue = true, workerObserveInterval
		return false, nil
	}
	s.reports = view.Reports

	names := map[string]bool{}
	for _, w := range desiredWorkerNames(s.agg) {
		names[w] = true
	}
	for _, a := range s.agg.Status.Assignments {
		names[a.Worker] = true
	}
	for w := range s.pods {
		names[w] = true
	}
	s.states = map[string]workerState{}
	for w := range names {
		_, answered := s.reports[w]
		first := view.FirstAsked[w]
		if first.IsZero() {
			first = s.now // not probed: no pod that may run
		}
		s.states[w] = workerHealth(s.pods[w], answered, view.LastAnswer[w], first, s.now, s.timeout)
		if s.states[w] == workerLive {
			s.obs.Live++
		}
	}

	// Stalls: an owner whose shard has records to read and reads none.
	reports := shardReports(s.agg.Status.Assignments, s.reports)
	for p, w := range ownersOf(s.agg.Status.Assignments) {
		ss, ok := reports[p]
		if !ok {
			continue
		}
		prog, stalled := trackProgress(s.mem.progress[p], w, ss, s.now, s.timeout)
		s.mem.progress[p] = prog
		if stalled && s.states[w] == workerLive {
			log.FromContext(ctx).Info("Worker makes no progress on a shard", "worker", w, "partition", p,
				"consumed", ss.GetConsumed(), "sourceCommitted", ss.GetSourceCommitted(), "reason", streamsv1alpha1.RestorationWorkerStalled)
			s.states[w] = workerStalled
			s.agg.Status.Benched = benchWorker(s.agg.Status.Benched, w, s.now.Add(stalledBench*s.timeout), streamsv1alpha1.RestorationWorkerStalled)
		}
	}
	return true, nil
}

// gather asks every worker for its Status, in parallel, each call on its
// own deadline. A worker serving another Aggregation does not count as
// answering for this one.
func (r *AggregationReconciler) gather(ctx context.Context, addrs map[string]string, agg *streamsv1alpha1.Aggregation) map[string]*catenapb.AggregatorStatus {
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = map[string]*catenapb.AggregatorStatus{}
	)
	name := agg.Namespace + "/" + agg.Name
	for w, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := r.Conns.Get(addr)
			if err != nil {
				return
			}
			cctx, cancel := context.WithTimeout(ctx, statusProbeTimeout)
			defer cancel()
			st, err := catenapb.NewAggregatorClient(conn).Status(cctx, &catenapb.AggregatorStatusRequest{})
			if err != nil {
				log.FromContext(ctx).V(1).Info("Worker did not answer", "worker", w, "error", err.Error())
				return
			}
			if a := st.GetAggregation(); a != "" && a != name {
				log.FromContext(ctx).Info("Worker serves another Aggregation", "worker", w, "serves", a)
				return
			}
			mu.Lock()
			out[w] = st
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// desiredWorkerNames are the StatefulSet's pod names, in ordinal order.
func desiredWorkerNames(agg *streamsv1alpha1.Aggregation) []string {
	n := max(agg.Spec.Workers, 1)
	out := make([]string, 0, n)
	for i := range n {
		out = append(out, fmt.Sprintf("%s-%d", agg.WorkersName(), i))
	}
	return out
}

// planAndRecord plans the assignment and, when it changed, writes it to
// status under the optimistic lock before any worker hears of it: a
// master that dies after writing leaves a decision the next one pushes,
// and one acting on a stale Aggregation fails to write and decides again.
func (r *AggregationReconciler) planAndRecord(ctx context.Context, s *aggScope) (bool, error) {
	reports := shardReports(s.agg.Status.Assignments, s.reports)
	settled := true
	for p := range s.source.Spec.Partitions {
		if reports[p].GetPhase() != catenapb.ShardPhase_SHARD_PHASE_RUNNING {
			settled = false
		}
	}
	benched, kept := stillBenched(s.agg.Status.Benched, s.now)
	s.agg.Status.Benched = kept
	gen := s.agg.Status.AssignmentGeneration
	for _, st := range s.reports {
		gen = max(gen, st.GetGeneration())
	}
	s.plan = planAssignment(assignmentInput{
		Partitions: s.source.Spec.Partitions,
		Workers:    desiredWorkerNames(s.agg),
		States:     s.states,
		Benched:    benched,
		Current:    s.agg.Status.Assignments,
		Generation: gen,
		Settled:    settled,
		// observedGeneration is written each round after the push: behind
		// metadata.generation, the spec changed since the last one.
		SpecChanged: s.agg.Status.ObservedGeneration != 0 && s.agg.Status.ObservedGeneration != s.agg.Generation,
	})
	s.obs.Unowned = s.plan.Unowned
	if !s.plan.Changed {
		return true, nil
	}
	logger := log.FromContext(ctx)
	for _, m := range s.plan.Moves {
		logger.Info("Reassigning shard", "partition", m.Partition, "from", m.From, "to", m.To,
			"reason", moveReason(m), "generation", s.plan.Generation, "fromState", s.states[m.From].String())
	}
	// The patch is relative to the Aggregation as read: it also carries
	// the benches this round decided, which the moves follow from.
	before := s.before
	s.agg.Status.Assignments = s.plan.Assignments
	s.agg.Status.AssignmentGeneration = s.plan.Generation
	s.agg.Status.Restoring = awaitRestores(s.agg.Status.Restoring, s.plan.Moves, s.plan.Generation, s.now)
	if err := r.Client.Status().Patch(ctx, s.agg, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			logger.V(1).Info("The Aggregation changed meanwhile; deciding again on its next version")
			s.stale = true
			return false, nil
		}
		return false, fmt.Errorf("failed to record assignment generation %d: %w", s.plan.Generation, err)
	}
	s.before = s.agg.DeepCopy()
	for _, m := range s.plan.Moves {
		aggReassignments.WithLabelValues(moveReason(m)).Inc()
		if m.From == "" {
			continue
		}
		delete(s.mem.progress, m.Partition)
		kind := corev1.EventTypeWarning
		if m.Reason == streamsv1alpha1.RestorationRebalanced {
			kind = corev1.EventTypeNormal
		}
		r.event(s.agg, kind, m.Reason, "Reassign", "Shard %d moves from %s to %s at assignment generation %d",
			m.Partition, m.From, m.To, s.plan.Generation)
	}
	return true, nil
}

func moveReason(m shardMove) string {
	if m.Reason == "" {
		return "Assigned"
	}
	return m.Reason
}

// pushAssignments sends every live worker its shards under the current
// generation, unless it reports that generation already. A worker that
// reports a newer one is ahead of the operator's cache: it is left alone.
func (r *AggregationReconciler) pushAssignments(ctx context.Context, s *aggScope) (bool, error) {
	specJSON, err := json.Marshal(s.agg.Spec)
	if err != nil {
		return false, fmt.Errorf("failed to encode the spec: %w", err)
	}
	ingest := r.ingestAddr(s.source)
	gen := s.agg.Status.AssignmentGeneration
	peers := map[string]string{}
	for w, addr := range s.addrs {
		if st := s.states[w]; st == workerLive || st == workerStalled || st == workerSilent {
			peers[w] = addr
		}
	}
	owners := map[uint32]string{}
	shardsOf := map[string][]uint32{}
	for _, a := range s.agg.Status.Assignments {
		for _, p := range a.Partitions {
			owners[uint32(p)] = a.Worker
			shardsOf[a.Worker] = append(shardsOf[a.Worker], uint32(p))
		}
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		sent    bool
		answers = map[string]*catenapb.AggregatorStatus{}
	)
	for _, w := range slices.Sorted(maps.Keys(s.reports)) {
		st := s.reports[w]
		if (s.states[w] != workerLive && s.states[w] != workerStalled) || st.GetGeneration() >= gen {
			continue
		}
		req := &catenapb.AssignRequest{
			Aggregation:      s.agg.Namespace + "/" + s.agg.Name,
			Generation:       gen,
			SpecJson:         specJSON,
			Shards:           shardsOf[w],
			Peers:            peers,
			Owners:           owners,
			SourcePartitions: uint32(s.source.Spec.Partitions),
			Ingest:           ingest,
			CheckpointStream: s.agg.CheckpointStreamName(),
			Consumer:         s.agg.ConsumerName(),
		}
		sent = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			log.FromContext(ctx).Info("Assigning shards", "worker", w, "shards", req.Shards, "generation", gen)
			resp, err := r.assign(ctx, s.addrs[w], req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				log.FromContext(ctx).Error(err, "Worker did not take its assignment; retrying", "worker", w, "generation", gen)
				s.obs.AssignErrors = append(s.obs.AssignErrors, w)
				aggAssignErrors.WithLabelValues(s.agg.Namespace).Inc()
				return
			}
			answers[w] = resp
		}()
	}
	wg.Wait()
	maps.Copy(s.reports, answers)
	if sent {
		// The next look wants the workers' answers to what they were
		// sent.
		s.workers.probes.Poke()
	}
	return true, nil
}

// ingestAddr is the ingestion address workers read source through.
func (r *AggregationReconciler) ingestAddr(source *streamsv1alpha1.Stream) string {
	if r.IngestAddr != nil {
		return r.IngestAddr(source)
	}
	return source.Status.Endpoints.Producers
}

func (r *AggregationReconciler) assign(ctx context.Context, addr string, req *catenapb.AssignRequest) (*catenapb.AggregatorStatus, error) {
	conn, err := r.Conns.Get(addr)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, statusProbeTimeout)
	defer cancel()
	return catenapb.NewAggregatorClient(conn).Assign(cctx, req)
}

// recordShards fills status.shards, the stable checkpoint and the
// restorations that finished.
func (r *AggregationReconciler) recordShards(ctx context.Context, s *aggScope) (bool, error) {
	status := &s.agg.Status
	reports := shardReports(status.Assignments, s.reports)
	owners := ownersOf(status.Assignments)
	var awaited []streamsv1alpha1.ShardMove
	for _, m := range status.Restoring {
		if owners[m.Partition] != m.ToWorker {
			continue // given up by its new owner since, without a restore
		}
		if rest, ok := completedRestoration(m, reports[m.Partition]); ok {
			s.restored = append(s.restored, rest)
			continue
		}
		awaited = append(awaited, m)
	}
	status.Restoring = awaited
	status.Restorations = appendRestorations(status.Restorations, s.restored...)
	status.Shards = aggShards(s.source.Spec.Partitions, status.Assignments, reports, status.Shards)
	status.StableCheckpoint = stableCheckpoint(status.Shards, s.agg.Spec.CheckpointInterval.Duration, status.StableCheckpoint)
	return true, nil
}

// restorationsRecorded says in the log, an Event and a metric that the
// restorations status now lists are done. It runs once the status is
// written: a restoration whose write failed stays in status.restoring and
// is recorded on a later round, by this operator or the next.
func (r *AggregationReconciler) restorationsRecorded(ctx context.Context, s *aggScope) {
	for _, rest := range s.restored {
		from := "the start of the source"
		if rest.Checkpoint != nil {
			from = fmt.Sprintf("checkpoint epoch %d (source offset %d, manifest %d)", rest.Checkpoint.Epoch, rest.Checkpoint.SourceOffset, rest.Checkpoint.ManifestOffset)
		}
		log.FromContext(ctx).Info("Shard restored", "partition", rest.Partition, "worker", rest.ToWorker, "from", rest.FromWorker, "reason", rest.Reason,
			"checkpointsLoaded", rest.CheckpointsLoaded, "recordsReplayed", rest.RecordsReplayed)
		r.event(s.agg, corev1.EventTypeNormal, "ShardRestored", "Restore",
			"Shard %d restored on %s from %s and %d replayed records (%s after %s)", rest.Partition, rest.ToWorker, from, rest.RecordsReplayed, rest.Reason, rest.FromWorker)
		aggRestorations.WithLabelValues(rest.Reason).Inc()
	}
}

// finalize releases a deleted Aggregation: it stops the workers (deleting
// the StatefulSet, and assigning the workers that still answer no shards,
// so that none renews a hold), releases the consumer's retention holds on
// the source and checkpoint streams on every replica of their pool, and
// then lets the Aggregation go. A replica that does not answer holds the
// Aggregation (an Event names it) until it does or the finalizer is
// removed by hand.
func (r *AggregationReconciler) finalize(ctx context.Context, agg *streamsv1alpha1.Aggregation) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(agg, AggregationFinalizer) {
		return reconcile.Result{}, nil
	}
	r.workers.forget(client.ObjectKeyFromObject(agg))
	logger := log.FromContext(ctx)
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: agg.Namespace, Name: agg.WorkersName()}}
	if err := r.Client.Delete(ctx, sts); client.IgnoreNotFound(err) != nil {
		return reconcile.Result{}, fmt.Errorf("failed to delete the workers of Aggregation %s: %w", agg.Name, err)
	}
	r.stopWorkers(ctx, agg)

	pending, err := r.releaseHolds(ctx, agg)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(pending) > 0 {
		logger.Info("Waiting for replicas to release the Aggregation's retention holds", "pending", pending, "consumer", agg.ConsumerName())
		r.event(agg, corev1.EventTypeWarning, "ReleasePending", "Finalize",
			"Waiting for %s to release the retention holds of %s; remove the finalizer %s by hand to leave them there",
			strings.Join(pending, ", "), agg.ConsumerName(), AggregationFinalizer)
		return reconcile.Result{RequeueAfter: dropRetryInterval}, nil
	}
	logger.Info("Released the Aggregation's retention holds", "consumer", agg.ConsumerName())
	before := agg.DeepCopy()
	controllerutil.RemoveFinalizer(agg, AggregationFinalizer)
	if err := r.Client.Patch(ctx, agg, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("failed to remove the finalizer of Aggregation %s: %w", agg.Name, err)
	}
	return reconcile.Result{}, nil
}

// stopWorkers assigns every worker that answers no shards, under a
// generation above any it holds. Best effort: a worker that does not
// answer goes with its pod.
func (r *AggregationReconciler) stopWorkers(ctx context.Context, agg *streamsv1alpha1.Aggregation) {
	var list corev1.PodList
	if err := r.Client.List(ctx, &list, client.InNamespace(agg.Namespace), client.MatchingLabels(aggSelectorLabels(agg))); err != nil {
		log.FromContext(ctx).Error(err, "Failed to list the worker pods")
		return
	}
	addrOf := r.WorkerAddr
	if addrOf == nil {
		addrOf = WorkerDNSAddr
	}
	addrs := map[string]string{}
	for i := range list.Items {
		addrs[list.Items[i].Name] = addrOf(&list.Items[i])
	}
	gen := agg.Status.AssignmentGeneration
	reports := r.gather(ctx, addrs, agg)
	for _, st := range reports {
		gen = max(gen, st.GetGeneration())
	}
	specJSON, err := json.Marshal(agg.Spec)
	if err != nil {
		return
	}
	partitions := max(int32(len(agg.Status.Shards)), 1)
	ingest := ""
	source := &streamsv1alpha1.Stream{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: agg.Namespace, Name: agg.Spec.Source}, source); err == nil {
		partitions, ingest = source.Spec.Partitions, r.ingestAddr(source)
	}
	for w := range reports {
		_, err := r.assign(ctx, addrs[w], &catenapb.AssignRequest{
			Aggregation: agg.Namespace + "/" + agg.Name, Generation: gen + 1, SpecJson: specJSON,
			SourcePartitions: uint32(partitions), Ingest: ingest,
			CheckpointStream: agg.CheckpointStreamName(), Consumer: agg.ConsumerName(),
		})
		if err != nil {
			log.FromContext(ctx).V(1).Info("Worker did not take its empty assignment", "worker", w, "error", err.Error())
		}
	}
}

// releaseHolds asks every replica of the pool hosting the source to release
// the Aggregation's holds on the source and checkpoint streams, and returns
// the replicas that did not answer. Releasing is idempotent.
func (r *AggregationReconciler) releaseHolds(ctx context.Context, agg *streamsv1alpha1.Aggregation) ([]string, error) {
	poolName := ""
	members := [][]streamsv1alpha1.ChainMember{}
	for _, name := range []string{agg.Spec.Source, agg.CheckpointStreamName()} {
		st := &streamsv1alpha1.Stream{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: agg.Namespace, Name: name}, st)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("failed to read Stream %s: %w", name, err)
		}
		if poolName == "" {
			poolName = st.PoolName()
		}
		var chains streamsv1alpha1.ReplicationChainList
		if err := r.Client.List(ctx, &chains, client.InNamespace(agg.Namespace), client.MatchingLabels{labelStream: name}); err != nil {
			return nil, fmt.Errorf("failed to list the ReplicationChains of Stream %s: %w", name, err)
		}
		for _, c := range chains.Items {
			members = append(members, c.Status.Members)
		}
	}
	if poolName == "" {
		return nil, nil // both Streams are gone, and their holds with them
	}
	pool := &streamsv1alpha1.ReplicaPool{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: agg.Namespace, Name: poolName}, pool); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	addr := r.ReplicaAddr
	if addr == nil {
		addr = PodDNSAddr
	}
	addrs := poolReplicaAddrs(pool, addr, members...)
	var pending []string
	for _, pod := range slices.Sorted(maps.Keys(addrs)) {
		if err := r.releaseOn(ctx, addrs[pod], agg); err != nil {
			log.FromContext(ctx).V(1).Info("A replica did not release the Aggregation's holds", "replica", pod, "error", err.Error())
			pending = append(pending, pod)
		}
	}
	return pending, nil
}

// releaseOn releases, on the replica at addr, every hold of the
// Aggregation's consumer on the source and checkpoint streams: the
// consumer itself and the names under it (workers hold the checkpoint
// stream as <consumer>.shard-<n>), as the replica lists them.
func (r *AggregationReconciler) releaseOn(ctx context.Context, addr string, agg *streamsv1alpha1.Aggregation) error {
	conn, err := r.Conns.Get(addr)
	if err != nil {
		return err
	}
	rc := catenapb.NewReplicaClient(conn)
	consumer := agg.ConsumerName()
	for _, stream := range []string{agg.Spec.Source, agg.CheckpointStreamName()} {
		cctx, cancel := context.WithTimeout(ctx, statusProbeTimeout)
		st, err := rc.Status(cctx, &catenapb.StatusRequest{Stream: stream})
		cancel()
		if err != nil {
			return fmt.Errorf("failed to read the holds on Stream %s: %w", stream, err)
		}
		names := map[string]bool{consumer: true}
		for _, ps := range st.GetPartitions() {
			for _, h := range ps.GetHolds() {
				if c := h.GetConsumer(); c == consumer || strings.HasPrefix(c, consumer+".") {
					names[c] = true
				}
			}
		}
		for _, c := range slices.Sorted(maps.Keys(names)) {
			cctx, cancel := context.WithTimeout(ctx, statusProbeTimeout)
			_, err := rc.ReleaseRetention(cctx, &catenapb.ReleaseRetentionRequest{Stream: stream, Consumer: c})
			cancel()
			if err != nil {
				return fmt.Errorf("failed to release the holds of %s on Stream %s: %w", c, stream, err)
			}
		}
	}
	return nil
}

// SetupWithManager registers the reconciler: it watches Aggregations, the
// objects they own, their source Streams and their worker pods.
func (r *AggregationReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &streamsv1alpha1.Aggregation{}, aggSourceIndex, func(obj client.Object) []string {
		return []string{obj.(*streamsv1alpha1.Aggregation).Spec.Source}
	}); err != nil {
		return fmt.Errorf("failed to index Aggregations by source: %w", err)
	}
	r.workers = newWorkerObservers(mgr.GetClient(), r.Conns, r.WorkerAddr, r.Now)
	if err := mgr.Add(r.workers); err != nil {
		return fmt.Errorf("failed to register the Aggregations' worker observer: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Certificates != nil {
		b = r.Certificates.watchCertificates(b, "Aggregation", func(ctx context.Context) ([]reconcile.Request, error) {
			var l streamsv1alpha1.AggregationList
			err := r.Client.List(ctx, &l)
			return requestsFor(l.Items), err
		})
	}
	return b.
		For(&streamsv1alpha1.Aggregation{}).
		WatchesRawSource(source.Channel(r.workers.Wake, &handler.EnqueueRequestForObject{})).
		Owns(&streamsv1alpha1.Stream{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Watches(&streamsv1alpha1.Stream{}, handler.EnqueueRequestsFromMapFunc(r.aggregationsOfSource)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.aggregationOfPod)).
		Named("aggregation").
		Complete(r)
}

// aggregationsOfSource maps a Stream to the Aggregations reading it, and
// to the one whose checkpoint Stream is named like it (a Stream that took
// the name and goes away unblocks it).
func (r *AggregationReconciler) aggregationsOfSource(ctx context.Context, obj client.Object) []reconcile.Request {
	var list streamsv1alpha1.AggregationList
	if err := r.Client.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{aggSourceIndex: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "Failed to list the Aggregations of a Stream", "stream", obj.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items)+1)
	probe := &streamsv1alpha1.Aggregation{}
	if name, ok := strings.CutSuffix(obj.GetName(), "-checkpoints"); ok {
		probe.Name = name
		if probe.CheckpointStreamName() == obj.GetName() {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}})
		}
	}
	for _, a := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: a.Namespace, Name: a.Name}})
	}
	return reqs
}

// aggregationOfPod maps a worker pod to its Aggregation: a pod failing is
// the fastest failure signal Kubernetes gives.
func (r *AggregationReconciler) aggregationOfPod(_ context.Context, obj client.Object) []reconcile.Request {
	l := obj.GetLabels()
	name := l[labelAggregation]
	if l[labelName] != appName || l[labelComponent] != componentAggregator || name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
}
