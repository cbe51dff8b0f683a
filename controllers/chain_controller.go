package controllers

import (
	"context"
	"fmt"
	"maps"
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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
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
	// statusProbeTimeout bounds each Status call: a paused replica must not
	// hold the others' chains up.
	statusProbeTimeout = time.Second
	// chainResyncInterval is how often a settled chain is probed: it is how
	// quickly a silent replica is noticed when no pod event says so.
	chainResyncInterval = time.Second
	// chainBusyInterval is the next look at a chain still converging.
	chainBusyInterval = 200 * time.Millisecond
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

	mu sync.Mutex
	// detectors decide each pool's replicas' health from the probe rounds
	// (the failure detector catena dev runs too).
	detectors map[types.NamespacedName]*chainmaster.Detector
	// agreements of returning replicas, by chain and replica.
	agreements map[types.NamespacedName]map[string]chainmaster.Agreement
	// placed are placements written but maybe not yet in the cache, by
	// pool, then chain: a chain placed a moment ago counts in the next
	// chain's placement.
	placed map[types.NamespacedName]map[string][]string
	// probes are the latest Status answers of each pool's replicas, for
	// all their partitions: every chain of a pool reads them, so a pool
	// costs one probe per replica per round, not one per chain.
	probes map[types.NamespacedName]*poolProbe
}

// poolProbe is one round of Status answers from a pool's replicas.
type poolProbe struct {
	at    time.Time
	addrs map[string]string
	resps map[string]*catenapb.StatusResponse
}

// probeFreshness is how long a pool's probe serves its chains' rounds. It
// is shorter than chainBusyInterval, so a chain that just acted sees its
// replicas anew next time.
const probeFreshness = 150 * time.Millisecond

// probe returns the pool's replicas' answers (all their partitions) and
// when they were asked: from the last round when it is fresh and asked the
// same addresses, otherwise from a new round.
func (r *ChainReconciler) probe(ctx context.Context, pool *streamsv1alpha1.ReplicaPool, addrs map[string]string) (map[string]*catenapb.StatusResponse, time.Time) {
	key := client.ObjectKeyFromObject(pool)
	r.mu.Lock()
	if p := r.probes[key]; p != nil && r.now().Sub(p.at) < probeFreshness && maps.Equal(p.addrs, addrs) {
		r.mu.Unlock()
		return p.resps, p.at
	}
	r.mu.Unlock()
	at := r.now()
	resps := chainmaster.Gather(ctx, r.Conns, addrs, "", nil, statusProbeTimeout)
	r.mu.Lock()
	if r.probes == nil {
		r.probes = map[types.NamespacedName]*poolProbe{}
	}
	r.probes[key] = &poolProbe{at: at, addrs: maps.Clone(addrs), resps: resps}
	r.mu.Unlock()
	return resps, at
}

func (r *ChainReconciler) forgetProbe(pool *streamsv1alpha1.ReplicaPool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.probes, client.ObjectKeyFromObject(pool))
}

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
	resps, probedAt := r.probe(ctx, pool, addrs)
	reports := chainmaster.PartitionReports(resps, stream.Name, partition)
	now := r.now()
	health, failed, answered := r.health(pool, addrs, resps, pods, chainmaster.NeighbourDown(reports), probedAt, now)

	if chainRecord(chain) == nil && chainmaster.LatestReport(reports) == nil {
		return r.place(ctx, chain, pool, names)
	}

	cfg := streamConfig(stream)
	minLen := minChainLength(stream)
	key := client.ObjectKeyFromObject(chain)
	repair, err := chainmaster.Plan(chainmaster.Input{
		Stream: stream.Name, Partition: partition, Config: cfg,
		Replication: int(chain.Spec.ReplicationFactor), MinLength: minLen,
		Addrs: addrs, Failed: failed, Reports: reports, Answered: answered,
		Chain: chainRecord(chain), Agreements: r.agreementsOf(key),
		LinkTimeoutMs: uint64(r.failureTimeout().Milliseconds()),
	})
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("failed to plan chain %s: %w", chain.Name, err)
	}
	writesAllowed := true
	busy := false
	if repair != nil {
		writesAllowed = repair.Plan.WritesAllowed
		if repair.Plan.Changed {
			// The new membership is written before it is installed: a
			// master that dies half-way leaves a record the next one
			// finishes.
			if err := r.recordReconfiguration(ctx, chain, repair, now); err != nil {
				return reconcile.Result{}, err
			}
		}
		busy = true
		found, err := chainmaster.Executor{Conns: r.Conns, Log: logger}.Execute(ctx, stream.Name, repair)
		// What the replicas run changed: the next look probes afresh.
		r.forgetProbe(pool)
		r.keepAgreements(key, found)
		if err != nil {
			logger.Error(err, "Chain step failed; retrying", "epoch", repair.Plan.Epoch, "reason", repair.Plan.Reason)
			r.event(chain, corev1.EventTypeWarning, "ReconfigurationFailed", "Reconfigure",
				"Step %q at epoch %d failed: %v", repair.Plan.Reason, repair.Plan.Epoch, err)
			chainRPCErrors.WithLabelValues(chain.Namespace).Inc()
		}
	}

	obs := chainObservation{Reports: reports, Health: health, WritesAllowed: writesAllowed, MinLength: minLen}
	if err := r.writeStatus(ctx, chain, obs); err != nil {
		return reconcile.Result{}, err
	}
	if busy || !chain.Converged() {
		return reconcile.Result{RequeueAfter: chainBusyInterval}, nil
	}
	return reconcile.Result{RequeueAfter: chainResyncInterval}, nil
}

// place puts a chain without members on the pool's pods and writes the
// placement as the chain's first target epoch; the next round installs it.
func (r *ChainReconciler) place(ctx context.Context, chain *streamsv1alpha1.ReplicationChain, pool *streamsv1alpha1.ReplicaPool, pods []string) (reconcile.Result, error) {
	var list streamsv1alpha1.ReplicationChainList
	if err := r.Client.List(ctx, &list, client.InNamespace(chain.Namespace), client.MatchingFields{chainPoolIndex: pool.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("failed to list the ReplicationChains of pool %s: %w", pool.Name, err)
	}
	onPool := slices.DeleteFunc(list.Items, func(c streamsv1alpha1.ReplicationChain) bool { return c.Name == chain.Name })
	load := poolLoad(onPool)
	poolKey := client.ObjectKeyFromObject(pool)
	r.mu.Lock()
	for name, members := range r.placed[poolKey] {
		if name == chain.Name || slices.ContainsFunc(onPool, func(c streamsv1alpha1.ReplicationChain) bool { return c.Name == name && len(c.Status.Members) > 0 }) {
			// Counted from the cache, which has caught up: the ledger
			// entry has done its job.
			delete(r.placed[poolKey], name)
			continue
		}
		addPlacement(load, members)
	}
	r.mu.Unlock()

	members := placeChain(pods, load, int(chain.Spec.ReplicationFactor))
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
	log.FromContext(ctx).Info("Placed chain", "members", members, "epoch", 1)
	r.event(chain, corev1.EventTypeNormal, string(streamsv1alpha1.ReconfigurationCreated), "Place", "%s at epoch 1", msg)
	chainReconfigurations.WithLabelValues(string(streamsv1alpha1.ReconfigurationCreated)).Inc()
	return reconcile.Result{RequeueAfter: time.Millisecond}, nil
}

// recordReconfiguration writes a plan's membership and epoch to the chain's
// status, with optimistic locking: a master acting on a stale copy of the
// chain must not overwrite a newer decision.
func (r *ChainReconciler) recordReconfiguration(ctx context.Context, chain *streamsv1alpha1.ReplicationChain, repair *chainmaster.Repair, now time.Time) error {
	before := chain.DeepCopy()
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
	if err := r.Client.Status().Patch(ctx, chain, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("failed to record epoch %d of chain %s: %w", repair.Plan.Epoch, chain.Name, err)
	}
	log.FromContext(ctx).Info("Reordering chain", "reason", reason, "from", repair.Chain.Members, "fromEpoch", repair.Chain.Epoch,
		"members", repair.Plan.Members, "epoch", repair.Plan.Epoch, "writesAllowed", repair.Plan.WritesAllowed,
		"actions", chainmaster.ActionStrings(repair.Plan.Actions))
	kind := corev1.EventTypeNormal
	if reason != streamsv1alpha1.ReconfigurationMemberReturned && reason != streamsv1alpha1.ReconfigurationMemberReplaced {
		kind = corev1.EventTypeWarning
	}
	r.event(chain, kind, string(reason), "Reconfigure", "%s", msg)
	chainReconfigurations.WithLabelValues(string(reason)).Inc()
	return nil
}

// writeStatus records the members' confirmations and the conditions of the
// chain, and the Partition's status.
func (r *ChainReconciler) writeStatus(ctx context.Context, chain *streamsv1alpha1.ReplicationChain, obs chainObservation) error {
	before := chain.DeepCopy()
	chain.Status = chainStatus(chain, obs)
	if !equality.Semantic.DeepEqual(before.Status, chain.Status) {
		if err := r.Client.Status().Patch(ctx, chain, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("failed to patch the status of chain %s: %w", chain.Name, err)
		}
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
	if err := r.Client.Status().Patch(ctx, part, client.MergeFrom(pbefore)); err != nil {
		return fmt.Errorf("failed to patch the status of partition %s: %w", part.Name, err)
	}
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

// health decides every replica's health from this round's answers, its
// history, its pod and its neighbours' reports.
func (r *ChainReconciler) health(pool *streamsv1alpha1.ReplicaPool, addrs map[string]string, resps map[string]*catenapb.StatusResponse, pods map[string]*corev1.Pod, neighbours map[string]time.Duration, probedAt, now time.Time) (map[string]chainplan.Health, map[string]bool, map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.detectors == nil {
		r.detectors = map[types.NamespacedName]*chainmaster.Detector{}
	}
	key := client.ObjectKeyFromObject(pool)
	d := r.detectors[key]
	if d == nil || d.Timeout() != r.failureTimeout() {
		d = chainmaster.NewDetector(r.failureTimeout())
		r.detectors[key] = d
	}
	health := map[string]chainplan.Health{}
	failed := map[string]bool{}
	answered := map[string]bool{}
	ids := make([]string, 0, len(addrs))
	for id := range addrs {
		ids = append(ids, id)
		if _, ok := resps[id]; ok {
			answered[id] = true
		}
	}
	d.Round(probedAt, ids, answered)
	for _, id := range ids {
		h := memberHealth(pods[id], d.Health(id, now, neighbours[id]), now, r.failureTimeout())
		health[id] = h
		failed[id] = h == chainplan.Failed
	}
	return health, failed, answered
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
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.agreements, key)
	for pool, placed := range r.placed {
		if pool.Namespace == key.Namespace {
			delete(placed, key.Name)
		}
	}
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
	return ctrl.NewControllerManagedBy(mgr).
		For(&streamsv1alpha1.ReplicationChain{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.chainsOnPodsPool)).
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
