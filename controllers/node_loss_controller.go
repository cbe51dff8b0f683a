package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// NodeLossOptions turn on the replacement of replicas lost with their node
// (planNodeLoss).
type NodeLossOptions struct {
	// Grace is how long a node may be NotReady before its replicas are
	// lost with it (0: DefaultNodeLossGrace).
	Grace time.Duration
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete

// reconcileNodeLoss replaces, when planNodeLoss says so, one replica of the
// pool lost with its node: its volume is kept (reclaim policy Retain), its
// claim and pod are deleted, and the StatefulSet recreates both, the claim
// bound to a free volume on another node. It returns when to look again
// (a node's grace running out) and the pool's NodeLoss condition (nil: no
// change).
func (r *ReplicaPoolReconciler) reconcileNodeLoss(ctx context.Context, pool *streamsv1alpha1.ReplicaPool, obs poolObservation) (time.Duration, *metav1.Condition, error) {
	in, err := r.observeNodeLoss(ctx, pool, obs)
	if err != nil {
		return 0, nil, err
	}
	plan := planNodeLoss(in)
	for _, l := range plan.Finish {
		if err := r.deleteLostPod(ctx, in.Pods[l.Pod], l); err != nil {
			return 0, nil, err
		}
	}
	cond := nodeLossCondition(pool, plan)
	if plan.Replace == nil {
		return plan.RequeueAfter, cond, nil
	}
	l := *plan.Replace
	logger := log.FromContext(ctx).WithValues("replica", l.Pod, "node", l.Node, "claim", l.Claim, "volume", l.Volume)
	// The cache decided; the API server confirms before anything is given
	// up: a Node that came back, or replacement just turned off, keeps the
	// replica.
	if why, err := r.confirmReplacement(ctx, in, l); err != nil || why != "" {
		if err == nil {
			logger.Info("Not replacing a lost replica: the API server, read again, says otherwise", "why", why)
		}
		return nodeLossRecheck, nil, err
	}
	if l.RetainVolume {
		pv := in.Volumes[l.Volume]
		before := pv.DeepCopy()
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		if err := r.Client.Patch(ctx, pv, client.MergeFrom(before)); err != nil {
			return 0, nil, fmt.Errorf("failed to keep PersistentVolume %s (reclaim policy Retain) before replacing %s: %w", l.Volume, l.Pod, err)
		}
	}
	claim := in.Claims[l.Claim]
	if err := r.Client.Delete(ctx, claim, client.Preconditions{UID: &claim.UID}); err != nil && !apierrors.IsNotFound(err) {
		return 0, nil, fmt.Errorf("failed to delete PersistentVolumeClaim %s of lost replica %s: %w", l.Claim, l.Pod, err)
	}
	if err := r.deleteLostPod(ctx, in.Pods[l.Pod], l); err != nil {
		return 0, nil, err
	}
	msg := fmt.Sprintf("Replica %s was lost with node %s (%s): deleted its claim %s (PersistentVolume %s kept, reclaim policy Retain) and its pod; "+
		"the pod comes back on another node with an empty volume and its chains copy it in", l.Pod, l.Node, l.Why, l.Claim, l.Volume)
	logger.Info("Replacing a replica lost with its node", "why", l.Why)
	if r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, "LostReplicaReplaced", "ReplaceLostReplica", "%s", msg)
	}
	cond = &metav1.Condition{Type: streamsv1alpha1.ReplicaPoolNodeLossCondition, Status: metav1.ConditionTrue,
		Reason: streamsv1alpha1.ReplicaPoolReplacingReason, Message: msg}
	if len(plan.Waiting) > 0 {
		cond.Message += "; not yet: " + strings.Join(plan.Waiting, "; ")
	}
	return plan.RequeueAfter, cond, nil
}

// deleteLostPod deletes a lost replica's pod (nil: nothing to delete), so
// that the StatefulSet recreates it with a new claim. A pod still bound to
// the lost node is deleted with grace 0: its kubelet is gone, or cut off,
// and will not confirm the end, and the StatefulSet makes no new pod while
// this one exists. Were that node only cut off, its old pod may run on
// until the cut heals, next to the new one under the same name: harmless
// here, as it has been taken out of every chain under a newer epoch (it
// can commit nothing), and the two have different volumes.
func (r *ReplicaPoolReconciler) deleteLostPod(ctx context.Context, pod *corev1.Pod, l lostReplica) error {
	if pod == nil {
		return nil
	}
	opts := []client.DeleteOption{client.Preconditions{UID: &pod.UID}}
	if l.PodOnNode {
		opts = append(opts, client.GracePeriodSeconds(0))
	}
	if err := r.Client.Delete(ctx, pod, opts...); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to delete pod %s of lost replica: %w", l.Pod, err)
	}
	return nil
}

// confirmReplacement reads again from the API server (not the cache) what
// the cache gave the replica up on: its node still lost, and replacement
// still on for the pool and every Stream on it. The cache's informers
// are separate (a Node's deletion may arrive before the annotation set on
// the pool just before it). It returns "" to go ahead, else why not.
func (r *ReplicaPoolReconciler) confirmReplacement(ctx context.Context, in nodeLossInput, l lostReplica) (string, error) {
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	fresh := in
	pool := &streamsv1alpha1.ReplicaPool{}
	if err := reader.Get(ctx, client.ObjectKeyFromObject(in.Pool), pool); err != nil {
		return "", fmt.Errorf("failed to read ReplicaPool %s again: %w", in.Pool.Name, err)
	}
	streams, err := poolStreams(ctx, reader, pool)
	if err != nil {
		return "", err
	}
	fresh.Pool, fresh.Streams = pool, streams
	if off := replacementDisabled(fresh); off != "" {
		return "replacement is off (" + off + ")", nil
	}
	host, _ := volumeNode(in.Volumes[l.Volume])
	n, err := nodeByHostname(ctx, reader, host)
	if err != nil {
		return "", err
	}
	fresh.Nodes = map[string]*corev1.Node{}
	if n != nil {
		fresh.Nodes[host] = n
	}
	if _, _, lost := replicaLost(fresh, l.Pod); !lost {
		return "its node " + host + " is no longer lost", nil
	}
	return "", nil
}

// nodeByHostname is the one Node labelled kubernetes.io/hostname=host
// (nil: none). Two such Nodes are an error: which one holds the volume
// cannot be told.
func nodeByHostname(ctx context.Context, reader client.Reader, host string) (*corev1.Node, error) {
	var nodes corev1.NodeList
	if err := reader.List(ctx, &nodes, client.MatchingLabels{corev1.LabelHostname: host}); err != nil {
		return nil, fmt.Errorf("failed to read the Node labelled %s=%s: %w", corev1.LabelHostname, host, err)
	}
	switch len(nodes.Items) {
	case 0:
		return nil, nil
	case 1:
		return &nodes.Items[0], nil
	}
	return nil, fmt.Errorf("%d Nodes are labelled %s=%s: which one holds the volume cannot be told", len(nodes.Items), corev1.LabelHostname, host)
}

// observeNodeLoss reads the pool's pods and claims, their volumes and the
// volumes' nodes.
func (r *ReplicaPoolReconciler) observeNodeLoss(ctx context.Context, pool *streamsv1alpha1.ReplicaPool, obs poolObservation) (nodeLossInput, error) {
	now := time.Now
	if r.now != nil {
		now = r.now
	}
	in := nodeLossInput{
		Pool: pool, Streams: obs.streams, Chains: obs.chains,
		Pods: map[string]*corev1.Pod{}, Claims: map[string]*corev1.PersistentVolumeClaim{},
		Volumes: map[string]*corev1.PersistentVolume{}, Nodes: map[string]*corev1.Node{},
		Grace: r.NodeLoss.Grace, Now: now(),
	}
	if in.Grace <= 0 {
		in.Grace = DefaultNodeLossGrace
	}
	sel := client.MatchingLabels(poolSelectorLabels(pool))
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(pool.Namespace), sel); err != nil {
		return in, fmt.Errorf("failed to list the replica pods of ReplicaPool %s: %w", pool.Name, err)
	}
	for i := range pods.Items {
		in.Pods[pods.Items[i].Name] = &pods.Items[i]
	}
	var claims corev1.PersistentVolumeClaimList
	if err := r.Client.List(ctx, &claims, client.InNamespace(pool.Namespace), sel); err != nil {
		return in, fmt.Errorf("failed to list the PersistentVolumeClaims of ReplicaPool %s: %w", pool.Name, err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		in.Claims[c.Name] = c
		if c.Spec.VolumeName == "" {
			continue
		}
		pv := &corev1.PersistentVolume{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: c.Spec.VolumeName}, pv); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return in, fmt.Errorf("failed to read PersistentVolume %s of claim %s: %w", c.Spec.VolumeName, c.Name, err)
		}
		in.Volumes[pv.Name] = pv
		host, ok := volumeNode(pv)
		if !ok {
			continue
		}
		if _, seen := in.Nodes[host]; seen {
			continue
		}
		n, err := nodeByHostname(ctx, r.Client, host)
		if err != nil {
			return in, err
		}
		if n != nil {
			in.Nodes[host] = n
		}
	}
	return in, nil
}

// nodeLossCondition is the pool's NodeLoss condition when nothing is
// replaced in this pass: True while replicas are lost, False (Replaced)
// once none is after a replacement, nil (left as it is, or absent) on a
// pool that never lost one.
func nodeLossCondition(pool *streamsv1alpha1.ReplicaPool, plan nodeLossPlan) *metav1.Condition {
	c := &metav1.Condition{Type: streamsv1alpha1.ReplicaPoolNodeLossCondition, Status: metav1.ConditionTrue}
	switch {
	case plan.Replace != nil:
		return nil // the caller says what it did
	case plan.Disabled != "":
		c.Reason = streamsv1alpha1.ReplicaPoolReplacementOffReason
	case len(plan.Waiting) > 0:
		c.Reason = streamsv1alpha1.ReplicaPoolReplacementWaitingReason
	default:
		prev := meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolNodeLossCondition)
		switch {
		case prev == nil || prev.Status == metav1.ConditionFalse:
			return nil // never lost, or already said so
		case prev.Reason == streamsv1alpha1.ReplicaPoolReplacingReason:
			msg, _, _ := strings.Cut(prev.Message, "; not yet: ")
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, streamsv1alpha1.ReplicaPoolReplacedReason, msg
		default:
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, streamsv1alpha1.ReplicaPoolNoneLostReason, "No replica is lost with its node"
		}
		return c
	}
	c.Message = "Lost with their node and not replaced yet: " + strings.Join(plan.Waiting, "; ")
	return c
}

// setNodeLossCondition sets cond on status (nil: no change).
func setNodeLossCondition(status *streamsv1alpha1.ReplicaPoolStatus, generation int64, cond *metav1.Condition) {
	if cond == nil {
		return
	}
	cond.ObservedGeneration = generation
	meta.SetStatusCondition(&status.Conditions, *cond)
}
