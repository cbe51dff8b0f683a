package controllers

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/transport"
)

// ReplicaAddrFunc returns the address at which the operator, and the other
// members of a chain, reach replica pod of pool.
type ReplicaAddrFunc func(pool *streamsv1alpha1.ReplicaPool, pod string) string

// Timing of the chain controller.
const (
	// DefaultFailureTimeout is how long a replica may stay silent (or its
	// pod not Ready) before its chains are reordered without it.
	DefaultFailureTimeout = 3 * time.Second
	// statusProbeTimeout bounds the Status calls the operator makes inside
	// a reconcile (aggregation workers, stream volumes): a paused replica
	// must not hold the others up.
	statusProbeTimeout = time.Second
	// chainCallTimeout bounds each call of a chain step (Configure,
	// EpochEnd, Truncate, CatchUp, Drop): a member that stops answering
	// mid-step fails the step, which the next round plans again without
	// it, instead of holding the chain.
	chainCallTimeout = 2 * time.Second
	// chainResyncInterval is how often a settled chain is looked at when
	// nothing wakes it: to record its members' progress (offsets, which
	// do not wake it). Whatever its master decides from wakes it through
	// the pool's observer, and a pod's change through its watch.
	chainResyncInterval = 5 * time.Second
	// chainBusyInterval is the next look at a chain still converging.
	chainBusyInterval = 200 * time.Millisecond
	// chainWaitInterval is the next look at a chain whose master waits for
	// its observer: a first snapshot, or one that shows its last action.
	chainWaitInterval = 50 * time.Millisecond
)

// ChainReconciler is each chain's master. It places a new ReplicationChain
// on its pool's pods, installs its membership on the members through the
// replica admin API (Configure), and afterwards keeps it whole: from the
// members' Status reports and their pods it plans the next membership with
// the same planner as catena dev (replica/chainmaster, replica/chainplan),
// writes it to the ReplicationChain's status before installing it under a
// new epoch, and records what each member confirmed. It also writes the
// Partition's status.
type ChainReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Conns dials replicas; ReplicaAddr says where they are.
	Conns       *transport.Pool
	ReplicaAddr ReplicaAddrFunc
	// FailureTimeout: see DefaultFailureTimeout.
	FailureTimeout time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	// Workers is how many chains are reconciled at once (0:
	// DefaultChainWorkers).
	Workers int

	// observers probe each pool's replicas outside the reconciles.
	observers *poolObservers
	// placeMu serialises placements: each counts the ones before it.
	placeMu sync.Mutex
	// acted is when each chain's master last called its replicas: it
	// decides again only from a snapshot that shows the outcome.
	acted stamps
	// progressWritten is when each Partition's status was last written
	// (see partitionProgressInterval).
	progressWritten stamps

	mu sync.Mutex
	// agreements of returning replicas, by chain and replica.
	agreements map[types.NamespacedName]map[string]chainmaster.Agreement
	// placed are placements written but maybe not yet in the cache, by
	// pool, then chain: a chain placed a moment ago counts in the next
	// chain's placement.
	placed map[types.NamespacedName]map[string][]string
}

// DefaultChainWorkers is how many chains the operator reconciles at once: a
// reconcile never waits on a probe, and its calls to replicas run on short
// deadlines, so a pool of hundreds of chains is repaired in parallel.
const DefaultChainWorkers = 16

// +kubebuilder:rbac:groups=streams.catena.io,resources=replicationchains,verbs=get;list;watch
// +kubebuilder:rbac:groups=streams.catena.io,resources=replicationchains/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=streams.catena.io,resources=partitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=streams.catena.io,resources=partitions/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=streams.catena.io,resources=streams,verbs=get;list;watch
// +kubebuilder:rbac:groups=streams.catena.io,resources=replicapools,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

func (r *ChainReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *ChainReconciler) failureTimeout() time.Duration {
	if r.FailureTimeout > 0 {
		return r.FailureTimeout
	}
	return DefaultFailureTimeout
}

// Reconcile takes one step of one chain's master.
func (r *ChainReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("replicationChain", req.NamespacedName)
	ctx = log.IntoContext(ctx, logger)

	chain := &streamsv1alpha1.ReplicationChain{}
	if err := r.Client.Get(ctx, req.NamespacedName, chain); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !chain.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	stream := &streamsv1alpha1.Stream{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: chain.Namespace, Name: chain.Spec.Stream}, stream); err != nil {
		// Gone: owner references delete the chain.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !stream.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	pool := &streamsv1alpha1.ReplicaPool{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: chain.Namespace, Name: chain.Spec.Pool}, pool); err != nil {
		// The Stream reports a missing pool; its creation wakes the chain.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}

	pods, err := r.poolPods(ctx, pool)
	if err != nil {
		return reconcile.Result{}, err
	}
	// Members of the chain beyond the pool's current size (it shrank) are
	// still asked: they may hold the only copy of committed records.
	addrs := poolReplicaAddrs(pool, r.ReplicaAddr, chain.Status.Members)
	var names []string // placement candidates: the pool's pods, in order
	for i := range pool.Spec.Replicas {
		names = append(names, pool.PodName(i))
	}

	partition := uint32(*chain.Spec.Partition)
	key := client.ObjectKeyFromObject(chain)
	obs := r.observers.observer(client.ObjectKeyFromObject(pool), addrs)
	snap := obs.Snapshot()
	if !snap.Complete || !snap.After(r.acted.get(key)) {
		// Not every replica has been asked yet (a replica not asked is not
		// one that holds nothing), or the replicas have not shown the
		// outcome of this master's last calls (it poked them when it
		// made them).
		return reconcile.Result{RequeueAfter: chainWaitInterval}, nil
	}
	reports := chainmaster.PartitionReports(snap.AnsweredReports(), stream.Name, partition)
	now := r.now()
	health, failed := r.health(addrs, snap, pods, now)

	if chainRecord(chain) == nil && chainmaster.LatestReport(reports) == nil {
		return r.place(ctx, chain, pool, names)
	}

	cfg := streamConfig(stream)
	minLen := minChainLength(stream)
	repair, err := chainmaster.Plan(chainmaster.Input{
		Stream: stream.Name, Partition: partition, Config: cfg,
		Replication: int(chain.Spec.ReplicationFactor), MinLength: minLen,
		Addrs: addrs, Failed: failed, Reports: reports, Answered: snap.Answered,
		Chain: chainRecord(chain), Agreements: r.agreementsOf(key),
		LinkTimeoutMs: uint64(r.failureTimeout().Milliseconds()),
	})
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("failed to plan chain %s: %w", chain.Name, err)
	}
	seen := chainObservation{Reports: reports, Health: health, WritesAllowed: true, MinLength: minLen}
	busy, changed := false, false
	if repair != nil {
		seen.WritesAllowed = repair.Plan.WritesAllowed
		if repair.Plan.Changed {
			// The new membership is written before it is installed: a
			// master that dies half-way leaves a record the next one
			// finishes, and the write, with optimistic locking on the
			// chain, orders the decisions of two operators (a leader and
			// the one that replaced it). It is one write with the
			// conditions it leads to: a failover costs the API as few
			// writes as it can.
			if err := r.recordReconfiguration(ctx, chain, repair, now, seen); err != nil {
				return reconcile.Result{}, err
			}
			changed = true
		}
		busy = true
		found, err := chainmaster.Executor{Conns: r.Conns, Log: logger, CallTimeout: chainCallTimeout}.Execute(ctx, stream.Name, repair)
		// What the replicas run changed: the next look waits for probes
		// asked from now on.
		r.acted.set(key, r.now())
		obs.Poke()
		r.keepAgreements(key, found)
		if err != nil {
			logger.Error(err, "Chain step failed; retrying", "epoch", repair.Plan.Epoch, "reason", repair.Plan.Reason)
			r.event(chain, corev1.EventTypeWarning, "ReconfigurationFailed", "Reconfigure",
				"Step %q at epoch %d failed: %v", repair.Plan.Reason, repair.Plan.Epoch, err)
			chainRPCErrors.WithLabelValues(chain.Namespace).Inc()
		}
	}

	// The Partition is written once the members have shown what they
	// run, not also in the step that changed the chain.
	if err := r.writeStatus(ctx, chain, seen, !changed); err != nil {
		return reconcile.Result{}, err
	}
	if busy || !chain.Converged() {
		// The observer wakes the chain as soon as the members report a
		// change; this is the fallback. Whatever woke this reconcile, the
		// next look is ordinary work.
		return reconcile.Result{RequeueAfter: chainBusyInterval, Priority: ptr.To(0)}, nil
	}
	// A settled chain's resync goes after every chain with work to do,
	// and chains placed together do not resync together.
	return reconcile.Result{RequeueAfter: resyncAfter(key), Priority: ptr.To(handler.LowPriority)}, nil
}

// resyncAfter is when a settled chain is next looked at: the resync
// interval plus up to a fifth of it, fixed per chain, so that the chains
// of a Stream, all placed at once, spread their resyncs.
func resyncAfter(key types.NamespacedName) time.Duration {
	h := fnv.New32a()
	h.Write([]byte(key.String()))
	return chainResyncInterval + time.Duration(h.Sum32()%1000)*chainResyncInterval/5000
}

// urgentPriority is the work queue priority of a chain with a failed
// member: above the default (0) of every other reason to reconcile;
// headFailedPriority of one whose head failed, above that (see
// poolObservers.HeadFailed).
const (
	urgentPriority     = 100
	headFailedPriority = urgentPriority + 1
)

// enqueueAt enqueues the object of a generic event at priority, on a
// priority queue (controller-runtime's default); on another queue, as
// usual.
func enqueueAt(priority int) handler.EventHandler {
	return handler.Funcs{GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(e.Object)}
		if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(priority)}, req)
			return
		}
		q.Add(req)
	}}
}

// place puts a chain without members on the pool's pods and writes the
// placement as the chain's first target epoch; the next round installs it.
func (r *ChainReconciler) place(ctx context.Context, chain *streamsv1alpha1.ReplicationChain, pool *streamsv1alpha1.ReplicaPool, pods []string) (reconcile.Result, error) {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	var list streamsv1alpha1.ReplicationChainList
	if err := r.Client.List(ctx, &list, client.InNamespace(chain.Namespace), client.MatchingFields{chainPoolIndex: pool.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("failed to list the ReplicationChains of pool %s: %w", pool.Name, err)
	}
	onPool := slices.DeleteFunc(list.Items, func(c streamsv1alpha1.ReplicationChain) bool { return c.Name == chain.Name })
	load := poolLoad(onPool)
	poolKey := client.ObjectKeyFromObject(pool)
	r.mu.Lock()
	for name, members := range r.placed[poolKey] {
		if name == chain.Name {
			// Its own earlier placement, which the cache has not shown it
			// yet: not counted, and kept until the cache shows it (the
			// patch below fails on the stale copy meanwhile).
			continue
		}
		if slices.ContainsFunc(onPool, func(c streamsv1alpha1.ReplicationChain) bool { return c.Name == name && len(c.Status.Members) > 0 }) {
			// Counted from the cache, which has caught up: the ledger
			// entry has done its job.
			delete(r.placed[poolKey], name)
			continue
		}
		load.Add(members)
	}
	r.mu.Unlock()

	members := chainplan.Place(pods, load, int(chain.Spec.ReplicationFactor))
	if len(members) == 0 {
		return reconcile.Result{RequeueAfter: chainResyncInterval}, nil
	}
	before := chain.DeepCopy()
	chain.Status.TargetEpoch = 1
	chain.Status.Members = nil
	for _, m := range members {
		chain.Status.Members = append(chain.Status.Members, streamsv1alpha1.ChainMember{Name: m, State: streamsv1alpha1.MemberInChain})
	}
	msg := fmt.Sprintf("Placed on %s", strings.Join(members, ", "))
	chain.Status.LastReconfiguration = &streamsv1alpha1.Reconfiguration{
		Time: metav1.NewTime(r.now()), Epoch: 1, Reason: streamsv1alpha1.ReconfigurationCreated, Message: msg,
	}
	chain.Status = chainStatus(chain, chainObservation{WritesAllowed: true})
	if err := r.Client.Status().Patch(ctx, chain, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return reconcile.Result{}, fmt.Errorf("failed to record the placement of chain %s: %w", chain.Name, err)
	}
	r.mu.Lock()
	if r.placed == nil {
		r.placed = map[types.NamespacedName]map[string][]string{}
	}
	if r.placed[poolKey] == nil {
		r.placed[poolKey] = map[string][]string{}
	}
	r.placed[poolKey][chain.Name] = members
	r.mu.Unlock()
	// Its Event is recorded when the members confirm it (newlyConfirmed).
	log.FromContext(ctx).Info("Placed chain", "members", members, "epoch", 1)
	chainReconfigurations.WithLabelValues(string(streamsv1alpha1.ReconfigurationCreated)).Inc()
	return reconcile.Result{RequeueAfter: time.Millisecond}, nil
}

// recordReconfiguration writes a plan's membership and epoch to the chain's
// status, with optimistic locking: a master acting on a stale copy of the
// chain must not overwrite a newer decision.
func (r *ChainReconciler) recordReconfiguration(ctx context.Context, chain *streamsv1alpha1.ReplicationChain, repair *chainmaster.Repair, now time.Time, seen chainObservation) error {
	before := chain.DeepCopy()
	// The members may have confirmed the previous reconfiguration in the
	// reports this one is decided from (a spare is added as soon as a
	// failed member's removal is installed): its Event is due with this
	// write, which stores the confirmation.
	previous := newlyConfirmed(before.Status, chainStatus(before, seen))
	prev := map[string]streamsv1alpha1.ChainMember{}
	for _, m := range chain.Status.Members {
		prev[m.Name] = m
	}
	chain.Status.TargetEpoch = int64(repair.Plan.Epoch)
	chain.Status.Members = nil
	for _, m := range repair.Plan.Members {
		cm := prev[m]
		cm.Name = m
		if cm.State == "" {
			cm.State = streamsv1alpha1.MemberCatchingUp
		}
		chain.Status.Members = append(chain.Status.Members, cm)
	}
	reason := reconfigurationReason(repair.Chain.Members, repair.Plan.Members, repair.Plan.Reason)
	msg := fmt.Sprintf("%s: [%s] at epoch %d -> [%s] at epoch %d", repair.Plan.Reason,
		strings.Join(repair.Chain.Members, " "), repair.Chain.Epoch, strings.Join(repair.Plan.Members, " "), repair.Plan.Epoch)
	if !repair.Plan.WritesAllowed {
		msg += "; writes refused until the chain is long enough"
	}
	chain.Status.LastReconfiguration = &streamsv1alpha1.Reconfiguration{
		Time: metav1.NewTime(now), Epoch: int64(repair.Plan.Epoch), Reason: reason, Message: msg,
	}
	chain.Status = chainStatus(chain, seen)
	if err := r.Client.Status().Patch(ctx, chain, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("failed to record epoch %d of chain %s: %w", repair.Plan.Epoch, chain.Name, err)
	}
	log.FromContext(ctx).Info("Reordering chain", "reason", reason, "from", repair.Chain.Members, "fromEpoch", repair.Chain.Epoch,
		"members", repair.Plan.Members, "epoch", repair.Plan.Epoch, "writesAllowed", repair.Plan.WritesAllowed,
		"actions", chainmaster.ActionStrings(repair.Plan.Actions))
	r.confirmedEvent(chain, previous)
	// Its own Event is recorded when the members confirm it
	// (newlyConfirmed).
	chainReconfigurations.WithLabelValues(string(reason)).Inc()
	return nil
}

// writeStatus records the members' confirmations and the conditions of the
// chain, and, with partition, the Partition's status.
func (r *ChainReconciler) writeStatus(ctx context.Context, chain *streamsv1alpha1.ReplicationChain, obs chainObservation, partition bool) error {
	before := chain.DeepCopy()
	chain.Status = chainStatus(chain, obs)
	if !equality.Semantic.DeepEqual(before.Status, chain.Status) {
		if err := r.Client.Status().Patch(ctx, chain, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("failed to patch the status of chain %s: %w", chain.Name, err)
		}
		// Only once the confirmation is stored: a stale copy's patch
		// fails above and records nothing twice.
		r.confirmedEvent(chain, newlyConfirmed(before.Status, chain.Status))
	}
	if !partition {
		return nil
	}
	part := &streamsv1alpha1.Partition{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(chain), part); err != nil {
		// The Stream controller creates it; its creation wakes the chain.
		return client.IgnoreNotFound(err)
	}
	pbefore := part.DeepCopy()
	part.Status = partitionStatus(part, chain.Status, obs.Reports)
	if equality.Semantic.DeepEqual(pbefore.Status, part.Status) {
		return nil
	}
	key := client.ObjectKeyFromObject(part)
	now := r.now()
	if progressOnly(pbefore.Status, part.Status) && now.Sub(r.progressWritten.get(key)) < partitionProgressInterval {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, part, client.MergeFrom(pbefore)); err != nil {
		return fmt.Errorf("failed to patch the status of partition %s: %w", part.Name, err)
	}
	r.progressWritten.set(key, now)
	return nil
}

// poolPods reads the pool's pods by name.
func (r *ChainReconciler) poolPods(ctx context.Context, pool *streamsv1alpha1.ReplicaPool) (map[string]*corev1.Pod, error) {
	var list corev1.PodList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels(poolSelectorLabels(pool))); err != nil {
		return nil, fmt.Errorf("failed to list the pods of pool %s: %w", pool.Name, err)
	}
	pods := map[string]*corev1.Pod{}
	for i := range list.Items {
		pods[list.Items[i].Name] = &list.Items[i]
	}
	return pods, nil
}

// health decides every replica's health from the observer's verdict and
// its pod.
func (r *ChainReconciler) health(addrs map[string]string, snap chainmaster.Snapshot, pods map[string]*corev1.Pod, now time.Time) (map[string]chainplan.Health, map[string]bool) {
	health := map[string]chainplan.Health{}
	failed := map[string]bool{}
	for id := range addrs {
		h, ok := snap.Health[id]
		if !ok {
			h = chainplan.Unknown
		}
		h = memberHealth(pods[id], h, now, r.failureTimeout())
		health[id] = h
		failed[id] = h == chainplan.Failed
	}
	return health, failed
}

func (r *ChainReconciler) agreementsOf(key types.NamespacedName) map[string]chainmaster.Agreement {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]chainmaster.Agreement{}
	for id, a := range r.agreements[key] {
		out[id] = a
	}
	return out
}

func (r *ChainReconciler) keepAgreements(key types.NamespacedName, found map[string]chainmaster.Agreement) {
	if len(found) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.agreements == nil {
		r.agreements = map[types.NamespacedName]map[string]chainmaster.Agreement{}
	}
	if r.agreements[key] == nil {
		r.agreements[key] = map[string]chainmaster.Agreement{}
	}
	for id, a := range found {
		r.agreements[key][id] = a
	}
}

func (r *ChainReconciler) forget(key types.NamespacedName) {
	r.acted.forget(key)
	r.progressWritten.forget(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.agreements, key)
	for pool, placed := range r.placed {
		if pool.Namespace == key.Namespace {
			delete(placed, key.Name)
		}
	}
}

// confirmedEvent records the Event of a reconfiguration every member has
// confirmed (rc nil: none).
func (r *ChainReconciler) confirmedEvent(chain *streamsv1alpha1.ReplicationChain, rc *streamsv1alpha1.Reconfiguration) {
	if rc == nil {
		return
	}
	action := "Reconfigure"
	if rc.Reason == streamsv1alpha1.ReconfigurationCreated {
		action = "Place"
	}
	r.event(chain, reconfigurationEventType(rc.Reason), string(rc.Reason), action, "%s (epoch %d, confirmed by every member)", rc.Message, rc.Epoch)
}

func (r *ChainReconciler) event(chain *streamsv1alpha1.ReplicationChain, eventType, reason, action, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(chain, nil, eventType, reason, action, note, args...)
	}
}

// SetupWithManager registers the chain controller: it watches
// ReplicationChains, and wakes the chains of a pool when one of its pods
// changes (a pod failing is the fastest failure signal Kubernetes gives).
func (r *ChainReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &streamsv1alpha1.ReplicationChain{}, chainPoolIndex, func(obj client.Object) []string {
		return []string{obj.(*streamsv1alpha1.ReplicationChain).Spec.Pool}
	}); err != nil {
		return fmt.Errorf("failed to index ReplicationChains by pool: %w", err)
	}
	if err := registerPartitionCollector(metrics.Registry, mgr.GetClient()); err != nil {
		return fmt.Errorf("failed to register the partition gauges: %w", err)
	}
	r.observers = newPoolObservers(mgr.GetClient(), r.Conns, r.ReplicaAddr, r.failureTimeout(), r.Now)
	if err := mgr.Add(r.observers); err != nil {
		return fmt.Errorf("failed to register the replica pools' observer: %w", err)
	}
	workers := r.Workers
	if workers <= 0 {
		workers = DefaultChainWorkers
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&streamsv1alpha1.ReplicationChain{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.chainsOnPodsPool)).
		WatchesRawSource(source.Channel(r.observers.Wake, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(source.Channel(r.observers.Urgent, enqueueAt(urgentPriority))).
		WatchesRawSource(source.Channel(r.observers.HeadFailed, enqueueAt(headFailedPriority))).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Named("replicationchain").
		Complete(r)
}

// chainPoolIndex indexes ReplicationChains by the pool hosting them.
const chainPoolIndex = "streams.catena.io/chainPool"

// chainsOnPodsPool maps a replica pod to the chains on its pool.
func (r *ChainReconciler) chainsOnPodsPool(ctx context.Context, obj client.Object) []reconcile.Request {
	labels := obj.GetLabels()
	pool := labels[labelInstance]
	if labels[labelName] != appName || labels[labelComponent] != componentReplica || pool == "" {
		return nil
	}
	var list streamsv1alpha1.ReplicationChainList
	if err := r.Client.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{chainPoolIndex: pool}); err != nil {
		log.FromContext(ctx).Error(err, "Failed to list the chains on a pool", "replicaPool", pool)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, c := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
	}
	return reqs
}

// ReplicaPodSelector selects the replica pods of every pool: the operator's
// cache of pods is restricted to them.
func ReplicaPodSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{labelName: appName, labelComponent: componentReplica})
}
