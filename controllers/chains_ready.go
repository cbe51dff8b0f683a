package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// ChainsReadyCondition is the readiness gate of every replica pod. The
// operator sets it True when the pod is not owed to any chain: it is in
// chain at the target epoch in every chain that lists it, and no chain of
// its pool is short while the pod holds a copy of that chain's partition
// (removed after a failure and not yet taken back). A StatefulSet rolling
// update then waits for a restarted replica to be back in its chains
// before taking the next one down, and the PodDisruptionBudget counts it
// as disrupted until then. A container's readiness probe alone (the port
// answers) says nothing about the chains: rolling restarts that trusted it
// took the next pod down while the previous one was still out of its
// chains, and left a chain with no member in chain.
//
// The gate is per pod on purpose. A pool-wide gate (every pod NotReady
// while any chain is short) was tried first: the StatefulSet controller
// then replaced the other, healthy, NotReady pods of the old revision at
// once, taking three replicas down together. A chain does not list the
// members it lost, so the operator asks each replica which partitions it
// holds.
const ChainsReadyCondition corev1.PodConditionType = "streams.catena.io/chains-ready"

// Reasons of ChainsReadyCondition.
const (
	chainsReadyInChains    = "InChains"
	chainsReadyNotInChains = "NotInChains"
)

// partitionKey names a partition of a stream.
type partitionKey struct {
	stream    string
	partition int32
}

// heldCopy is what a replica reports of a partition copy it holds.
type heldCopy struct {
	// restored: reopened from its volume and waiting for a new epoch
	// (the replica's Status says so); the chain is about to take it out
	// and back, whatever the chain's status says of it yet.
	restored bool
}

// chainsReady decides a replica pod's gate from the chains of its pool and
// the partitions the replica reports it holds. It is false, with the
// reasons, while a chain lists the pod in another state than in chain, or
// while a chain is short of members and the pod holds a copy of its
// partition without being a member. A member that has not yet confirmed a
// new epoch still counts as in chain: every member of a reconfigured chain
// is in that state for a moment, and a gate that dropped them all at once
// would let a rolling update replace them together (the StatefulSet
// controller replaces NotReady pods of an old revision without waiting).
// A copy the replica reports restored holds the gate too: a restarted
// replica is listed in chain until the operator sees it restored, and a
// gate that opened in that moment let the rolling update take the next
// pod down just before the chains took this one out.
func chainsReady(pod string, chains []streamsv1alpha1.ReplicationChain, hosted map[partitionKey]heldCopy) (bool, string) {
	var waiting []string
	for _, c := range chains {
		if c.Spec.Partition != nil && hosted[partitionKey{c.Spec.Stream, *c.Spec.Partition}].restored {
			waiting = append(waiting, fmt.Sprintf("%s: its copy was reopened from its volume and waits for a new epoch", c.Name))
			continue
		}
		inChain, listed := 0, false
		for _, m := range c.Status.Members {
			ok := m.State == streamsv1alpha1.MemberInChain
			if ok {
				inChain++
			}
			if m.Name == pod {
				listed = true
				if !ok {
					waiting = append(waiting, fmt.Sprintf("%s lists it %s at epoch %d of %d", c.Name, m.State, m.ConfirmedEpoch, c.Status.TargetEpoch))
				}
			}
		}
		rf := int(c.Spec.ReplicationFactor)
		_, holds := hosted[partitionKey{c.Spec.Stream, ptr.Deref(c.Spec.Partition, -1)}]
		if !listed && inChain < rf && c.Spec.Partition != nil && holds {
			waiting = append(waiting, fmt.Sprintf("%s has %d of %d members in chain and not its copy", c.Name, inChain, rf))
		}
	}
	if len(waiting) == 0 {
		return true, "in chain in every chain that needs it"
	}
	sort.Strings(waiting)
	const most = 8
	msg := strings.Join(waiting[:min(len(waiting), most)], "; ")
	if len(waiting) > most {
		msg += fmt.Sprintf(" and %d more", len(waiting)-most)
	}
	return false, msg
}

// gateCondition is the pod condition for a decision, keeping the
// transition time when the status does not change.
func gateCondition(prev *corev1.PodCondition, ready bool, msg string, now metav1.Time) corev1.PodCondition {
	c := corev1.PodCondition{Type: ChainsReadyCondition, Status: corev1.ConditionFalse, Reason: chainsReadyNotInChains, Message: msg, LastTransitionTime: now}
	if ready {
		c.Status, c.Reason = corev1.ConditionTrue, chainsReadyInChains
	}
	if prev != nil && prev.Status == c.Status {
		c.LastTransitionTime = prev.LastTransitionTime
	}
	return c
}

// ChainsReadyReconciler sets ChainsReadyCondition on the replica pods of
// a pool from its ReplicationChains and what each replica holds.
type ChainsReadyReconciler struct {
	Client      client.Client
	Conns       *transport.Pool
	ReplicaAddr ReplicaAddrFunc
	// ledgers are the chain controller's (nil: the statuses alone).
	ledgers *chainLedgers
}

// gateRecheck is how soon a pool with a pod held back is looked at again:
// what a replica holds changes without its chains changing.
const gateRecheck = 2 * time.Second

// hostedBy asks a replica which partitions it holds.
func (r *ChainsReadyReconciler) hostedBy(ctx context.Context, addr string) (map[partitionKey]heldCopy, bool) {
	conn, err := r.Conns.Get(addr)
	if err != nil {
		return nil, false
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := catenapb.NewReplicaClient(conn).Status(cctx, &catenapb.StatusRequest{})
	if err != nil {
		return nil, false
	}
	out := map[partitionKey]heldCopy{}
	for _, p := range resp.GetPartitions() {
		out[partitionKey{p.GetStream(), int32(p.GetPartition())}] = heldCopy{restored: p.GetRestored()}
	}
	return out, true
}

// +kubebuilder:rbac:groups="",resources=pods/status,verbs=get;patch

// Reconcile handles one ReplicaPool (by name).
func (r *ChainsReadyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pool streamsv1alpha1.ReplicaPool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var pods corev1.PodList
	sel := selectorLabels(componentReplica, req.Name)
	if err := r.Client.List(ctx, &pods, client.InNamespace(req.Namespace), client.MatchingLabels(sel)); err != nil {
		return reconcile.Result{}, err
	}
	if len(pods.Items) == 0 {
		return reconcile.Result{}, nil
	}
	var all streamsv1alpha1.ReplicationChainList
	if err := r.Client.List(ctx, &all, client.InNamespace(req.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	var chains []streamsv1alpha1.ReplicationChain
	for _, c := range all.Items {
		if c.Spec.Pool == req.Name {
			chains = append(chains, c)
		}
	}
	if r.ledgers != nil {
		// A chain's status lags its record by a round: a spare must not
		// look unneeded while it still lists the member it replaces.
		if err := r.ledgers.showRecords(ctx, r.Client, chains); err != nil {
			return reconcile.Result{}, err
		}
	}
	now := metav1.Now()
	var result reconcile.Result
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !hasGate(pod) || pod.DeletionTimestamp != nil {
			continue
		}
		hosted, answered := r.hostedBy(ctx, r.ReplicaAddr(&pool, pod.Name))
		if !answered {
			// Unknown: keep the gate as it is (the container's readiness
			// probe says whether the process is up), and look again.
			result.RequeueAfter = gateRecheck
			continue
		}
		ready, msg := chainsReady(pod.Name, chains, hosted)
		if !ready {
			result.RequeueAfter = gateRecheck
		}
		var prev *corev1.PodCondition
		for j := range pod.Status.Conditions {
			if pod.Status.Conditions[j].Type == ChainsReadyCondition {
				prev = &pod.Status.Conditions[j]
			}
		}
		want := gateCondition(prev, ready, msg, now)
		if prev != nil && prev.Status == want.Status && prev.Message == want.Message {
			continue
		}
		patch := client.StrategicMergeFrom(pod.DeepCopy())
		if prev != nil {
			*prev = want
		} else {
			pod.Status.Conditions = append(pod.Status.Conditions, want)
		}
		if err := r.Client.Status().Patch(ctx, pod, patch); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		log.FromContext(ctx).V(1).Info("Set the chains-ready gate", "pod", pod.Name, "ready", ready, "message", msg)
	}
	return result, nil
}

func hasGate(pod *corev1.Pod) bool {
	for _, g := range pod.Spec.ReadinessGates {
		if g.ConditionType == ChainsReadyCondition {
			return true
		}
	}
	return false
}

// SetupWithManager registers the reconciler: a pool's gates are looked at
// again whenever one of its chains or pods changes.
func (r *ChainsReadyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	poolOfChain := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.(*streamsv1alpha1.ReplicationChain).Spec.Pool}}}
	})
	poolOfPod := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		l := obj.GetLabels()
		if l[labelComponent] != componentReplica || l[labelInstance] == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: l[labelInstance]}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("chains-ready").
		For(&streamsv1alpha1.ReplicaPool{}).
		Watches(&streamsv1alpha1.ReplicationChain{}, poolOfChain).
		Watches(&corev1.Pod{}, poolOfPod).
		Complete(r)
}
