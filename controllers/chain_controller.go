package controllers

import (
	"context"
	"errors"
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
// records it in the Stream's chain ledger (chain_ledger.go) before
// installing it under a new epoch, and shows the record and what each
// member confirmed in the ReplicationChain's status. It also writes the
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

	// ledgers hold each chain's record (chain_ledger.go).
	ledgers *chainLedgers
	// joins asks tails to reach the replicas that would join behind them.
	joins chainmaster.JoinCheck

	mu sync.Mutex
	// agreements of returning replicas, by chain and replica.
	agreements map[types.NamespacedName]map[string]chainmaster.Agreement
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
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update;delete
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
	streamKey := types.NamespacedName{Namespace: chain.Namespace, Name: chain.Spec.Stream}
	if err := r.Client.Get(ctx, streamKey, stream); err != nil {
		// Gone: owner references delete the chain, and its ledger.
		if apierrors.IsNotFound(err) {
			r.ledgers.forget(streamKey)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !stream.DeletionTimestamp.IsZero() {
		r.ledgers.forget(streamKey)
		return reconcile.Result{}, nil
	}
	if !metav1.IsControlledBy(chain, stream) {
		// A chain of an earlier Stream of that name, waiting for garbage
		// collection: not this Stream's, nor in its ledger.
		return reconcile.Result{}, nil
	}
	pool := &streamsv1alpha1.ReplicaPool{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: chain.Namespace, Name: chain.Spec.Pool}, pool); err != nil {
		// The Stream reports a missing pool; its creation wakes the chain.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}

	// The record is the ledger's entry (chain_ledger.go); the status shows
	// it from this round on, and is written with what else it shows.
	partition := uint32(*chain.Spec.Partition)
	stored := chain.DeepCopy()
	rec, err := r.ledgers.record(ctx, stream, partition)
	if err != nil {
		// Without its record the chain's master decides nothing.
		r.event(chain, corev1.EventTypeWarning, "ChainLedgerUnreadable", "Read", "%v", err)
		return reconcile.Result{}, err
	}
	if rec != nil && int64(rec.Epoch) > chain.Status.TargetEpoch {
		applyLedgerEntry(&chain.Status, *rec)
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
		return r.place(ctx, stream, chain, pool, names)
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
	seen := chainObservation{Reports: reports, Health: health, Nodes: podNodes(pods), WritesAllowed: true, MinLength: minLen}
	busy, changed := false, false
	if repair != nil {
		seen.WritesAllowed = repair.Plan.WritesAllowed
		exec := chainmaster.Executor{Conns: r.Conns, Log: logger, CallTimeout: chainCallTimeout}
		if repair.Plan.Changed && len(repair.Joins) > 0 {
			// A replica joins only once the member it joins behind
			// reaches it: a returned pod's name can resolve to nothing
			// for a while, and a link that does not come up within the
			// failure timeout is cut, with a member of the chain.
			if fresh, err := r.joins.Check(ctx, exec, repair); err != nil {
				if fresh {
					logger.Info("Waiting for a joining replica to be reachable from the chain", "members", repair.Plan.Members, "reason", err.Error())
				}
				seen.WritesAllowed = repair.ChainWritesAllowed
				if err := r.writeStatus(ctx, stored, chain, seen, true); err != nil {
					return reconcile.Result{}, err
				}
				// At the ordinary priority: a chain woken as urgent must
				// not keep that rank while it only waits.
				return reconcile.Result{RequeueAfter: chainmaster.RecheckAfter, Priority: ptr.To(0)}, nil
			}
		}
		if repair.Plan.Changed {
			// The new membership is written before it is installed: a
			// master that dies half-way leaves a record the next one
			// finishes, and the write, with optimistic locking on the
			// ledger, orders the decisions of two operators (a leader and
			// the one that replaced it). The decisions of a Stream's
			// chains are written together (chain_ledger.go).
			if err := r.recordReconfiguration(ctx, stream, stored, chain, repair, now, seen); err != nil {
				if errors.Is(err, errStaleRecord) {
					// Decided from a record since replaced: plan again.
					return reconcile.Result{RequeueAfter: chainWaitInterval}, nil
				}
				return reconcile.Result{}, err
			}
			changed = true
		}
		busy = true
		found, err := exec.Execute(ctx, stream.Name, repair)
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

	// A step that changed the chain writes no status: the ledger holds
	// the record, and the next round writes it to the status with what
	// the members confirmed: one write, after the installs of a failover,
	// not among them (writing it in this round as well measured 4.6-5.6 s
	// for the last of 128 removals instead of 2.9 s, with 55% more
	// writes). Whoever must not act on a status that lags the record
	// reads the ledger too (showRecords: the chains-ready gates).
	if !changed {
		if err := r.writeStatus(ctx, stored, chain, seen, true); err != nil {
			return reconcile.Result{}, err
		}
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

// place puts a chain without members on the pool's pods and records the
// placement in the ledger as the chain's first epoch; the next round
// installs it. Placements are made one at a time, each counting the ones
// before it (those still waiting for their ledger write too), and written
// together.
func (r *ChainReconciler) place(ctx context.Context, stream *streamsv1alpha1.Stream, chain *streamsv1alpha1.ReplicationChain, pool *streamsv1alpha1.ReplicaPool, pods []string) (reconcile.Result, error) {
	it, members, err := r.placement(ctx, stream, chain, pool, pods)
	if err != nil || it == nil {
		return reconcile.Result{RequeueAfter: chainResyncInterval}, err
	}
	if err := r.ledgers.wait(ctx, stream, it); err != nil {
		if errors.Is(err, errStaleRecord) {
			return reconcile.Result{RequeueAfter: chainWaitInterval}, nil
		}
		return reconcile.Result{}, fmt.Errorf("failed to record the placement of chain %s: %w", chain.Name, err)
	}
	// Its Event is recorded when the members confirm it (newlyConfirmed).
	log.FromContext(ctx).Info("Placed chain", "members", members, "epoch", 1)
	chainReconfigurations.WithLabelValues(string(streamsv1alpha1.ReconfigurationCreated)).Inc()
	return reconcile.Result{RequeueAfter: time.Millisecond}, nil
}

// placement decides where a chain goes and queues the decision for the
// ledger (nil: no pod to place it on yet).
func (r *ChainReconciler) placement(ctx context.Context, stream *streamsv1alpha1.Stream, chain *streamsv1alpha1.ReplicationChain, pool *streamsv1alpha1.ReplicaPool, pods []string) (*ledgerIntent, []string, error) {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	var list streamsv1alpha1.ReplicationChainList
	if err := r.Client.List(ctx, &list, client.InNamespace(chain.Namespace), client.MatchingFields{chainPoolIndex: pool.Name}); err != nil {
		return nil, nil, fmt.Errorf("failed to list the ReplicationChains of pool %s: %w", pool.Name, err)
	}
	onPool := slices.DeleteFunc(list.Items, func(c streamsv1alpha1.ReplicationChain) bool { return c.Name == chain.Name })
	// A chain placed (or reordered) a moment ago: the ledger has it
	// before its status does.
	if err := r.ledgers.showRecords(ctx, r.Client, onPool); err != nil {
		return nil, nil, err
	}
	members := chainplan.Place(pods, poolLoad(onPool), int(chain.Spec.ReplicationFactor))
	if len(members) == 0 {
		return nil, nil, nil
	}
	e := ledgerEntry{Chain: chain.UID, Epoch: 1, Members: members, Reason: streamsv1alpha1.ReconfigurationCreated,
		Message: fmt.Sprintf("Placed on %s", strings.Join(members, ", ")), Time: metav1.NewTime(r.now())}
	return r.ledgers.submit(stream, uint32(*chain.Spec.Partition), 0, e), members, nil
}

// recordReconfiguration records a plan's membership and epoch in the ledger
// (chain_ledger.go), decided from the record in chain's status, and makes
// chain's status show it. stored is the chain as the API holds it.
func (r *ChainReconciler) recordReconfiguration(ctx context.Context, stream *streamsv1alpha1.Stream, stored, chain *streamsv1alpha1.ReplicationChain, repair *chainmaster.Repair, now time.Time, seen chainObservation) error {
	// The members may have confirmed the previous reconfiguration in the
	// reports this one is decided from (a spare is added as soon as a
	// failed member's removal is installed): its Event is due now, as the
	// status will not show that confirmation.
	previous := newlyConfirmed(stored.Status, chainStatus(chain, seen))
	reason := reconfigurationReason(repair.Chain.Members, repair.Plan.Members, repair.Plan.Reason)
	msg := fmt.Sprintf("%s: [%s] at epoch %d -> [%s] at epoch %d", repair.Plan.Reason,
		strings.Join(repair.Chain.Members, " "), repair.Chain.Epoch, strings.Join(repair.Plan.Members, " "), repair.Plan.Epoch)
	if !repair.Plan.WritesAllowed {
		msg += "; writes refused until the chain is long enough"
	}
	e := ledgerEntry{Chain: chain.UID, Epoch: repair.Plan.Epoch, Members: slices.Clone(repair.Plan.Members), Reason: reason, Message: msg, Time: metav1.NewTime(now)}
	var base uint64
	if rec := chainRecord(chain); rec != nil {
		base = rec.Epoch
	}
	if err := r.ledgers.commit(ctx, stream, uint32(*chain.Spec.Partition), base, e); err != nil {
		return fmt.Errorf("failed to record epoch %d of chain %s: %w", repair.Plan.Epoch, chain.Name, err)
	}
	applyLedgerEntry(&chain.Status, e)
	log.FromContext(ctx).Info("Reordering chain", "reason", reason, "from", repair.Chain.Members, "fromEpoch", repair.Chain.Epoch,
		"members", repair.Plan.Members, "epoch", repair.Plan.Epoch, "writesAllowed", repair.Plan.WritesAllowed,
		"actions", chainmaster.ActionStrings(repair.Plan.Actions))
	r.confirmedEvent(chain, previous)
	// Its own Event is recorded when the members confirm it
	// (newlyConfirmed).
	chainReconfigurations.WithLabelValues(string(reason)).Inc()
	return nil
}

// writeStatus records the chain's record (from the ledger), the members'
// confirmations and the conditions of the chain over before (the chain as
// the API holds it), and, with partition, the Partition's status.
func (r *ChainReconciler) writeStatus(ctx context.Context, before, chain *streamsv1alpha1.ReplicationChain, obs chainObservation, partition bool) error {
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

// podNodes maps each scheduled pod to its node.
func podNodes(pods map[string]*corev1.Pod) map[string]string {
	out := make(map[string]string, len(pods))
	for name, p := range pods {
		if p != nil && p.Spec.NodeName != "" {
			out[name] = p.Spec.NodeName
		}
	}
	return out
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
	if r.ledgers == nil {
		r.ledgers = &chainLedgers{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()}
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
