package controllers

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// A replica pod keeps its data on a local volume, so it is bound to the
// node that holds the volume. When that node is gone for good the pod can
// never run again: the StatefulSet recreates it, and the scheduler leaves
// it Pending, its claim bound to a volume on a node that does not exist.
// The chains already run without it (failure detection took it out); the
// operator then gives the replica a new, empty volume on another node, and
// its chains copy it in outside the chain, one lost member of a chain at a
// time.

// ReplaceLostReplicasAnnotation set to "false" on a ReplicaPool, or on any
// Stream on the pool, stops the operator from replacing the pool's
// replicas whose node is lost: they stay out of their chains until a
// person acts (docs/operator.md, "Node loss").
const ReplaceLostReplicasAnnotation = "streams.catena.io/replace-lost-replicas"

// DefaultNodeLossGrace is how long a replica's node may be NotReady before
// the replica is treated as lost with it (a deleted Node is lost at once).
// Longer than a reboot or a kubelet restart takes, so that a node that
// comes back keeps its replicas and their data.
const DefaultNodeLossGrace = 5 * time.Minute

// nodeLossInput is what the decision about one pool's lost replicas reads.
type nodeLossInput struct {
	Pool *streamsv1alpha1.ReplicaPool
	// Streams are the Streams on the pool (their annotations count).
	Streams []streamsv1alpha1.Stream
	// Pods are the pool's replica pods by name; Claims the PersistentVolumeClaims
	// by name; Volumes the PersistentVolumes by name; Nodes the cluster's
	// Nodes by name (a name missing from Nodes is a Node that does not
	// exist).
	Pods    map[string]*corev1.Pod
	Claims  map[string]*corev1.PersistentVolumeClaim
	Volumes map[string]*corev1.PersistentVolume
	Nodes   map[string]*corev1.Node
	// Chains are the chains on the pool.
	Chains []streamsv1alpha1.ReplicationChain
	Grace  time.Duration
	Now    time.Time
}

// lostReplica is a replica whose volume is on a lost node.
type lostReplica struct {
	Pod, Claim, Volume, Node string
	// Why says how the node is lost: deleted, or NotReady since when.
	Why string
	// PodOnNode: the pod object is still bound to the lost node (its
	// kubelet will never confirm its end, so it is deleted with grace 0).
	PodOnNode bool
	// RetainVolume: the volume's reclaim policy is not Retain; it is set
	// to Retain before the claim goes, so the volume object (and what a
	// person may still recover from the disk) is kept.
	RetainVolume bool
}

// nodeLossPlan is what to do about one pool's lost replicas.
type nodeLossPlan struct {
	// Replace is the lost replica to replace now, if any: at most one per
	// pass, and never one that shares a chain with a member that is not
	// back in it yet.
	Replace *lostReplica
	// Waiting says, per lost replica not replaced now, why not (sorted).
	Waiting []string
	// Disabled: the annotation that turned replacement off ("" when on).
	Disabled string
	// RequeueAfter is when a node's grace runs out (0: no such wait).
	RequeueAfter time.Duration
}

// planNodeLoss decides which of a pool's replicas are lost with their node
// and which one to replace now. A replica is lost when its claim is bound
// to a volume whose node affinity pins it to one node, and that Node is
// deleted or has not been Ready for Grace. A lost replica is replaced only
// when
//   - failure detection (not this) has taken it out of every chain, and
//     its pod is not Ready;
//   - every chain on the pool still has a member in chain whose volume is
//     not lost: the data has a live copy to be copied from, and a volume
//     that may hold a chain's last copy (every node of a chain lost at
//     once, or cut off from the control plane) is never given up;
//   - no other replica of the pool is on the way back: a replacement
//     still copying, a pod restarting on its own volume (not Ready, or a
//     member of a chain but not in it yet). The new replica joins chains
//     that may share members with any of them, so replacements go one at
//     a time, never two members of a chain at once.
func planNodeLoss(in nodeLossInput) nodeLossPlan {
	var plan nodeLossPlan
	lost := map[string]lostReplica{}
	var names []string
	for i := range in.Pool.Spec.Replicas {
		name := in.Pool.PodName(i)
		l, wait, ok := replicaLost(in, name)
		if wait > 0 && (plan.RequeueAfter == 0 || wait < plan.RequeueAfter) {
			plan.RequeueAfter = wait
		}
		if ok {
			lost[name] = l
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return plan
	}
	plan.Disabled = replacementDisabled(in)

	inChain := map[string][]string{}
	var recovering, noLiveCopy []string
	addOnce := func(list *[]string, s string) {
		if !slices.Contains(*list, s) {
			*list = append(*list, s)
		}
	}
	for _, c := range in.Chains {
		live := false
		for _, m := range c.Status.Members {
			_, isLost := lost[m.Name]
			switch {
			case m.State == streamsv1alpha1.MemberInChain:
				inChain[m.Name] = append(inChain[m.Name], c.Name)
				live = live || !isLost
			case !isLost:
				addOnce(&recovering, m.Name)
			}
		}
		if !live {
			noLiveCopy = append(noLiveCopy, c.Name)
		}
	}
	for i := range in.Pool.Spec.Replicas {
		name := in.Pool.PodName(i)
		if _, isLost := lost[name]; !isLost && (in.Pods[name] == nil || !podReady(in.Pods[name])) {
			addOnce(&recovering, name)
		}
	}
	slices.Sort(recovering)
	slices.Sort(noLiveCopy)

	for _, name := range names {
		l := lost[name]
		var why string
		switch {
		case plan.Disabled != "":
			why = "replacement is off (" + plan.Disabled + ")"
		case len(inChain[name]) > 0:
			why = "still in chains " + strings.Join(inChain[name], ", ")
		case in.Pods[name] != nil && podReady(in.Pods[name]):
			why = "its pod is still Ready"
		case len(noLiveCopy) > 0:
			why = "chains " + strings.Join(noLiveCopy, ", ") + " have no member in chain outside lost nodes: its volume may hold their last copy"
		case len(recovering) > 0:
			why = "waits for " + strings.Join(recovering, ", ") + " to be back in their chains"
		case plan.Replace != nil:
			why = "after " + plan.Replace.Pod
		}
		if why != "" {
			plan.Waiting = append(plan.Waiting, fmt.Sprintf("%s (node %s %s): %s", name, l.Node, l.Why, why))
			continue
		}
		plan.Replace = &l
	}
	return plan
}

// replicaLost reports whether the replica's volume is on a lost node, and,
// when its node is NotReady but within its grace, how long until it is
// lost.
func replicaLost(in nodeLossInput, pod string) (lostReplica, time.Duration, bool) {
	claimName := dataVolumeName + "-" + pod
	claim := in.Claims[claimName]
	if claim == nil || !claim.DeletionTimestamp.IsZero() || claim.Spec.VolumeName == "" {
		return lostReplica{}, 0, false
	}
	pv := in.Volumes[claim.Spec.VolumeName]
	if pv == nil {
		return lostReplica{}, 0, false
	}
	node, ok := volumeNode(pv)
	if !ok {
		return lostReplica{}, 0, false // not pinned to one node: the pod can run elsewhere
	}
	l := lostReplica{Pod: pod, Claim: claimName, Volume: pv.Name, Node: node,
		RetainVolume: pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain}
	if p := in.Pods[pod]; p != nil && p.Spec.NodeName == node {
		l.PodOnNode = true
	}
	n := in.Nodes[node]
	if n == nil {
		l.Why = "deleted"
		return l, 0, true
	}
	ready := nodeReadyCondition(n)
	if ready == nil || ready.Status == corev1.ConditionTrue {
		return lostReplica{}, 0, false
	}
	since := ready.LastTransitionTime.Time
	if left := since.Add(in.Grace).Sub(in.Now); left > 0 {
		return lostReplica{}, left, false
	}
	l.Why = fmt.Sprintf("NotReady since %s", since.UTC().Format(time.RFC3339))
	return l, 0, true
}

// volumeNode is the one node a volume's required node affinity allows
// (kubernetes.io/hostname In [one name]): what a local volume has.
func volumeNode(pv *corev1.PersistentVolume) (string, bool) {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return "", false
	}
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if len(terms) != 1 {
		return "", false
	}
	for _, e := range terms[0].MatchExpressions {
		if e.Key == corev1.LabelHostname && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
			return e.Values[0], true
		}
	}
	return "", false
}

func nodeReadyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// replacementDisabled names the object whose annotation turned
// replacement off, "" when none did.
func replacementDisabled(in nodeLossInput) string {
	off := func(o metav1.Object) bool {
		v, ok := o.GetAnnotations()[ReplaceLostReplicasAnnotation]
		return ok && strings.EqualFold(strings.TrimSpace(v), "false")
	}
	if off(in.Pool) {
		return fmt.Sprintf("ReplicaPool %s has %s=false", in.Pool.Name, ReplaceLostReplicasAnnotation)
	}
	for i := range in.Streams {
		if off(&in.Streams[i]) {
			return fmt.Sprintf("Stream %s has %s=false", in.Streams[i].Name, ReplaceLostReplicasAnnotation)
		}
	}
	return ""
}
