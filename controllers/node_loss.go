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
	// by name; Volumes the PersistentVolumes by name; Nodes the Node each
	// volume's kubernetes.io/hostname label names, by that label's value
	// (which need not be the Node's name): a value missing from Nodes is a
	// node that does not exist.
	Pods    map[string]*corev1.Pod
	Claims  map[string]*corev1.PersistentVolumeClaim
	Volumes map[string]*corev1.PersistentVolume
	Nodes   map[string]*corev1.Node
	// Chains are the chains on the pool.
	Chains []streamsv1alpha1.ReplicationChain
	// Grace is how long a node may be NotReady, or a replica's pod wait
	// unscheduled for its cordoned node, before the replica is lost.
	Grace time.Duration
	Now   time.Time
}

// replacementSettle is how long a replica whose claim is new, and that no
// chain lists in chain yet, counts as on its way back: a replacement
// becomes Ready (it holds no copy a chain waits for) a moment before its
// chains add it to copy in.
const replacementSettle = 2 * time.Minute

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
	// ClaimDeleting: the claim is already being deleted (a replacement
	// that stopped half way: its pod still holds the claim).
	ClaimDeleting bool
}

// nodeLossPlan is what to do about one pool's lost replicas.
type nodeLossPlan struct {
	// Replace is the lost replica to replace now, if any: at most one per
	// pass, and never one that shares a chain with a member that is not
	// back in it yet.
	Replace *lostReplica
	// Finish are replacements begun earlier whose pod still holds the
	// claim being deleted: their pods are deleted now.
	Finish []lostReplica
	// Waiting says, per lost replica not replaced now, why not (sorted).
	Waiting []string
	// Disabled: the annotation that turned replacement off ("" when on).
	Disabled string
	// RequeueAfter is when a node's grace runs out (0: no such wait).
	RequeueAfter time.Duration
}

// planNodeLoss decides which of a pool's replicas are lost with their node
// and which one to replace now. A replica is lost when its claim is bound
// to a volume whose node affinity pins it to one node (by its
// kubernetes.io/hostname label), and that Node is deleted, has not been
// Ready for Grace, or is cordoned while the replica's pod has waited
// unscheduled for Grace (a drain evicted it, and it cannot return to its
// volume). A lost replica is replaced only when
//   - failure detection (not this) has taken it out of every chain (no
//     chain lists it), and its pod is not Ready elsewhere (a pod still
//     bound to the lost node shows the Ready it last reported);
//   - every chain on the pool still has a member in chain, with a Ready
//     pod, whose volume is not lost: the data has a live copy to be copied
//     from, and a volume that may hold a chain's last copy (every node of
//     a chain lost at once, or cut off from the control plane) is never
//     given up;
//   - no other replica of the pool is on the way back: a replacement
//     still copying or not yet added to its chains (its claim is new), a
//     pod restarting on its own volume (not Ready, or listed in a chain
//     but not in it yet). The new replica joins chains that may share
//     members with any of them, so replacements go one at a time, never
//     two members of a chain at once.
//
// A replacement that stopped half way (its claim is being deleted, its pod
// still holds it) is finished: its pod is deleted.
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
		switch {
		case ok && l.ClaimDeleting:
			if in.Pods[name] != nil {
				plan.Finish = append(plan.Finish, l)
			}
		case ok:
			lost[name] = l
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return plan
	}
	plan.Disabled = replacementDisabled(in)

	listed := map[string][]string{}
	var recovering, noLiveCopy []string
	addOnce := func(list *[]string, s string) {
		if !slices.Contains(*list, s) {
			*list = append(*list, s)
		}
	}
	inChainSomewhere := map[string]bool{}
	shortChain := false // a chain a new replica may be about to join
	for _, c := range in.Chains {
		shortChain = shortChain || int32(len(c.Status.Members)) < c.Spec.ReplicationFactor
		live := false
		for _, m := range c.Status.Members {
			listed[m.Name] = append(listed[m.Name], c.Name)
			_, isLost := lost[m.Name]
			switch {
			case m.State == streamsv1alpha1.MemberInChain:
				inChainSomewhere[m.Name] = true
				// A live copy: in chain, its volume not lost, its pod Ready.
				live = live || (!isLost && in.Pods[m.Name] != nil && podReady(in.Pods[m.Name]))
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
		if _, isLost := lost[name]; isLost {
			continue
		}
		claim := in.Claims[dataVolumeName+"-"+name]
		switch {
		case in.Pods[name] == nil || !podReady(in.Pods[name]):
			addOnce(&recovering, name)
		case claim == nil || !claim.DeletionTimestamp.IsZero():
			addOnce(&recovering, name)
		case shortChain && !inChainSomewhere[name] && in.Now.Sub(claim.CreationTimestamp.Time) < replacementSettle:
			addOnce(&recovering, name) // a replacement about to be added to its chains
		}
	}
	for _, l := range plan.Finish {
		addOnce(&recovering, l.Pod)
	}
	slices.Sort(recovering)
	slices.Sort(noLiveCopy)

	for _, name := range names {
		l := lost[name]
		var why string
		switch {
		case plan.Disabled != "":
			why = "replacement is off (" + plan.Disabled + ")"
		case len(listed[name]) > 0:
			why = "still listed in chains " + strings.Join(listed[name], ", ")
		case in.Pods[name] != nil && podReady(in.Pods[name]) && !l.PodOnNode:
			// A pod on the lost node keeps the Ready it last reported: no
			// kubelet updates it (a deleted Node's pods stay Ready until
			// the pod garbage collector removes them, 40 s on).
			why = "its pod is still Ready"
		case len(noLiveCopy) > 0:
			why = "chains " + strings.Join(noLiveCopy, ", ") + " have no Ready member in chain outside lost nodes: its volume may hold their last copy"
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
	if len(plan.Waiting) > 0 && (plan.RequeueAfter == 0 || plan.RequeueAfter > nodeLossRecheck) {
		// What they wait for (a member leaving its chains, another one
		// coming back) shows in chains and pods that do not all wake the
		// pool: look again.
		plan.RequeueAfter = nodeLossRecheck
	}
	return plan
}

// nodeLossRecheck is how often a pool with lost replicas waiting is looked
// at again.
const nodeLossRecheck = 15 * time.Second

// replicaLost reports whether the replica's volume is on a lost node, and,
// when its node is NotReady but within its grace, how long until it is
// lost.
func replicaLost(in nodeLossInput, pod string) (lostReplica, time.Duration, bool) {
	claimName := dataVolumeName + "-" + pod
	claim := in.Claims[claimName]
	if claim == nil || claim.Spec.VolumeName == "" {
		return lostReplica{}, 0, false
	}
	pv := in.Volumes[claim.Spec.VolumeName]
	if pv == nil {
		return lostReplica{}, 0, false
	}
	host, ok := volumeNode(pv)
	if !ok {
		return lostReplica{}, 0, false // not pinned to one node: the pod can run elsewhere
	}
	l := lostReplica{Pod: pod, Claim: claimName, Volume: pv.Name, Node: host,
		RetainVolume:  pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain,
		ClaimDeleting: !claim.DeletionTimestamp.IsZero()}
	p := in.Pods[pod]
	n := in.Nodes[host]
	if n == nil {
		l.Why = "deleted"
		// Its name is gone with it: the label is its name on most clusters.
		// Where it was not, the pod waits for the pod garbage collector.
		l.PodOnNode = p != nil && p.Spec.NodeName == host
		return l, 0, true
	}
	l.Node = n.Name
	l.PodOnNode = p != nil && p.Spec.NodeName == n.Name
	if n.Spec.Unschedulable && p != nil && p.Spec.NodeName == "" {
		// Drained (or cordoned while its pod was deleted): the pod cannot
		// come back to its volume until someone uncordons the node. A
		// rolling restart during maintenance would do the same for a
		// moment: wait the grace, from when the pod could not be placed.
		since := p.CreationTimestamp.Time
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				since = c.LastTransitionTime.Time
			}
		}
		if left := since.Add(in.Grace).Sub(in.Now); left > 0 {
			return lostReplica{}, left, false
		}
		l.Why = fmt.Sprintf("cordoned, its pod unscheduled since %s", since.UTC().Format(time.RFC3339))
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

// volumeNode is the kubernetes.io/hostname label value of the one node a
// volume's required node affinity allows (kubernetes.io/hostname In [one
// value]): what a local volume has. The label is usually, not always, the
// Node's name.
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
