package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// ChainsReadyCondition is the readiness gate of every replica pod. The
// operator sets it True when the pod's pool holds every copy it should:
// every chain of the pool has its replicationFactor members in chain at
// its target epoch (so the pod, if a chain needs it, is back). A replica
// pod is then Ready only while taking it down costs a chain at most one
// copy: a StatefulSet rolling update waits before taking the next pod
// down, and the PodDisruptionBudget refuses evictions while any chain is
// short. A container's readiness probe alone (the port answers) says
// nothing about the chains: rolling restarts that trusted it took the
// next pod down while the previous one was still out of its chains, and
// left a chain with no member in chain. The gate is pool-wide because a
// chain does not list the members it lost: a pod removed from its chains
// and not yet taken back appears in none of them.
const ChainsReadyCondition corev1.PodConditionType = "streams.catena.io/chains-ready"

// Reasons of ChainsReadyCondition.
const (
	chainsReadyInChains    = "InChains"
	chainsReadyNotInChains = "NotInChains"
)

// chainsReady decides a replica pod's gate from the chains of its pool:
// false, with the chains named, while the pod is listed in a chain in
// another state than in chain or below the chain's target epoch, or while
// any chain of the pool has fewer than its replicationFactor members in
// chain at its target epoch.
func chainsReady(pod string, chains []streamsv1alpha1.ReplicationChain) (bool, string) {
	var waiting []string
	for _, c := range chains {
		inChain := 0
		for _, m := range c.Status.Members {
			ok := m.State == streamsv1alpha1.MemberInChain && m.ConfirmedEpoch >= c.Status.TargetEpoch
			if ok {
				inChain++
			}
			if m.Name == pod && !ok {
				waiting = append(waiting, fmt.Sprintf("%s lists it %s at epoch %d of %d", c.Name, m.State, m.ConfirmedEpoch, c.Status.TargetEpoch))
			}
		}
		if rf := int(c.Spec.ReplicationFactor); inChain < rf {
			waiting = append(waiting, fmt.Sprintf("%s has %d of %d members in chain", c.Name, inChain, rf))
		}
	}
	if len(waiting) == 0 {
		return true, "every chain of the pool has all its members in chain"
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
// a pool from its ReplicationChains.
type ChainsReadyReconciler struct {
	Client client.Client
}

// +kubebuilder:rbac:groups="",resources=pods/status,verbs=get;patch

// Reconcile handles one ReplicaPool (by name).
func (r *ChainsReadyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
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
	now := metav1.Now()
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !hasGate(pod) || pod.DeletionTimestamp != nil {
			continue
		}
		ready, msg := chainsReady(pod.Name, chains)
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
	return reconcile.Result{}, nil
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
