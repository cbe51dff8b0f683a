package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// lossWorld is a pool of three replicas, p-i on node n<i> with its claim
// data-p-i bound to local volume pv-i on that node, every node Ready, and
// two chains of all three members in chain; edit it, then plan.
type lossWorld struct{ in nodeLossInput }

var lossNow = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func newLossWorld() *lossWorld {
	pool := &streamsv1alpha1.ReplicaPool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	pool.Spec.Replicas = 3
	w := &lossWorld{in: nodeLossInput{
		Pool: pool, Pods: map[string]*corev1.Pod{}, Claims: map[string]*corev1.PersistentVolumeClaim{},
		Volumes: map[string]*corev1.PersistentVolume{}, Nodes: map[string]*corev1.Node{},
		Grace: 5 * time.Minute, Now: lossNow,
	}}
	for i := range 3 {
		pod, node, pv := fmt.Sprintf("p-%d", i), fmt.Sprintf("n%d", i), fmt.Sprintf("pv-%d", i)
		w.in.Pods[pod] = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pod},
			Spec:       corev1.PodSpec{NodeName: node},
			Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
		w.in.Claims["data-"+pod] = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-" + pod}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv}}
		w.in.Volumes[pv] = &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		}}
		w.in.Nodes[node] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(lossNow.Add(-time.Hour))},
		}}}
	}
	for _, c := range []string{"c0", "c1"} {
		ch := streamsv1alpha1.ReplicationChain{ObjectMeta: metav1.ObjectMeta{Name: c}}
		ch.Spec.ReplicationFactor = 3
		w.in.Chains = append(w.in.Chains, ch)
	}
	w.members("c0", "p-0", "p-1", "p-2")
	w.members("c1", "p-1", "p-2", "p-0")
	return w
}

// members sets a chain's members, all in chain; "name:State" for another state.
func (w *lossWorld) members(chain string, names ...string) *lossWorld {
	for i := range w.in.Chains {
		if w.in.Chains[i].Name != chain {
			continue
		}
		w.in.Chains[i].Status.Members = nil
		for _, n := range names {
			name, state, ok := strings.Cut(n, ":")
			if !ok {
				state = string(streamsv1alpha1.MemberInChain)
			}
			w.in.Chains[i].Status.Members = append(w.in.Chains[i].Status.Members, streamsv1alpha1.ChainMember{Name: name, State: streamsv1alpha1.MemberState(state)})
		}
	}
	return w
}

// nodeGone deletes node n<i>; the pod stays bound to it, not Ready.
func (w *lossWorld) nodeGone(i int) *lossWorld {
	delete(w.in.Nodes, fmt.Sprintf("n%d", i))
	w.podNotReady(i)
	return w
}

// nodeNotReady marks node n<i> NotReady for d; its pod is not Ready.
func (w *lossWorld) nodeNotReady(i int, d time.Duration) *lossWorld {
	n := w.in.Nodes[fmt.Sprintf("n%d", i)]
	n.Status.Conditions[0].Status = corev1.ConditionUnknown
	n.Status.Conditions[0].LastTransitionTime = metav1.NewTime(lossNow.Add(-d))
	w.podNotReady(i)
	return w
}

// drained cordons node n<i>; its pod, evicted and recreated, has waited
// unscheduled for d.
func (w *lossWorld) drained(i int, d time.Duration) *lossWorld {
	w.in.Nodes[fmt.Sprintf("n%d", i)].Spec.Unschedulable = true
	p := w.in.Pods[fmt.Sprintf("p-%d", i)]
	p.Spec.NodeName = ""
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionFalse},
		{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(lossNow.Add(-d))},
	}
	return w
}

func (w *lossWorld) podNotReady(i int) *lossWorld {
	w.in.Pods[fmt.Sprintf("p-%d", i)].Status.Conditions[0].Status = corev1.ConditionFalse
	return w
}

// out takes p-<i> out of both chains (what failure detection does).
func (w *lossWorld) out(i int) *lossWorld {
	for c := range w.in.Chains {
		var keep []streamsv1alpha1.ChainMember
		for _, m := range w.in.Chains[c].Status.Members {
			if m.Name != fmt.Sprintf("p-%d", i) {
				keep = append(keep, m)
			}
		}
		w.in.Chains[c].Status.Members = keep
	}
	return w
}

func TestPlanNodeLoss(t *testing.T) {
	cases := []struct {
		name        string
		world       *lossWorld
		replace     string // the pod replaced now ("" none)
		podOnNode   bool
		retain      bool
		waiting     []string // substrings, one per waiting replica, in order
		finish      []string // pods of replacements begun earlier, deleted now
		disabled    bool
		requeueNear time.Duration // 0: nodeLossRecheck while some wait, else none
	}{
		{name: "all healthy", world: newLossWorld()},
		{name: "node deleted, member out of its chains: replaced", world: newLossWorld().nodeGone(1).out(1), replace: "p-1", podOnNode: true},
		{name: "node deleted, pod recreated Pending (no node)", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			w.in.Pods["p-1"].Spec.NodeName = ""
			return w
		}(), replace: "p-1"},
		{name: "node deleted, pod gone too", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			delete(w.in.Pods, "p-1")
			return w
		}(), replace: "p-1", podOnNode: false},
		{name: "volume reclaim policy Delete is set to Retain first", world: func() *lossWorld {
			w := newLossWorld().nodeGone(2).out(2)
			w.in.Volumes["pv-2"].Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
			return w
		}(), replace: "p-2", podOnNode: true, retain: true},
		{name: "node NotReady within its grace: wait, and look again when it runs out", world: newLossWorld().nodeNotReady(0, 2*time.Minute).out(0), requeueNear: 3 * time.Minute},
		{name: "node NotReady past its grace: replaced", world: newLossWorld().nodeNotReady(0, 6*time.Minute).out(0), replace: "p-0", podOnNode: true},
		{name: "node drained: cordoned, the pod evicted and recreated Pending past the grace", world: newLossWorld().out(2).drained(2, 6*time.Minute), replace: "p-2"},
		{name: "node drained: the pod Pending within the grace", world: newLossWorld().out(2).drained(2, time.Minute), requeueNear: 4 * time.Minute},
		{name: "node drained: the pod not recreated yet", world: func() *lossWorld {
			w := newLossWorld().out(2).drained(2, 6*time.Minute)
			delete(w.in.Pods, "p-2")
			return w
		}()},
		{name: "a volume's node found by its hostname label, not its name", world: func() *lossWorld {
			w := newLossWorld().nodeNotReady(1, 6*time.Minute).out(1)
			n := w.in.Nodes["n1"]
			n.Name = "ip-10-0-0-1.compute.internal"
			w.in.Pods["p-1"].Spec.NodeName = n.Name
			return w
		}(), replace: "p-1", podOnNode: true},
		{name: "node cordoned with its pod still on it: the drain has not evicted it", world: func() *lossWorld {
			w := newLossWorld()
			w.in.Nodes["n2"].Spec.Unschedulable = true
			return w
		}()},
		{name: "node deleted but the member is still in a chain: failure detection first", world: newLossWorld().nodeGone(1),
			waiting: []string{"p-1 (node n1 deleted): still listed in chains c0, c1"}},
		{name: "a lost member still listed as failed: failure detection first", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1)
			w.members("c0", "p-0", "p-1:Failed", "p-2")
			w.members("c1", "p-2", "p-0")
			return w
		}(), waiting: []string{"p-1 (node n1 deleted): still listed in chains c0"}},
		{name: "a replacement Ready but in no chain yet blocks the next", world: func() *lossWorld {
			w := newLossWorld().nodeGone(2).out(2).out(1)
			w.in.Claims["data-p-1"].CreationTimestamp = metav1.NewTime(lossNow.Add(-30 * time.Second))
			w.in.Volumes["pv-1"].Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values = []string{"n0"}
			return w
		}(), waiting: []string{"p-2 (node n2 deleted): waits for p-1 to be back"}},
		{name: "a new claim in a pool whose chains are all full is no replacement on its way", world: func() *lossWorld {
			w := newLossWorld().nodeGone(2).out(2)
			w.in.Chains[0].Spec.ReplicationFactor, w.in.Chains[1].Spec.ReplicationFactor = 1, 1
			w.members("c0", "p-0")
			w.members("c1", "p-0")
			w.in.Claims["data-p-1"].CreationTimestamp = metav1.NewTime(lossNow.Add(-30 * time.Second))
			return w
		}(), replace: "p-2", podOnNode: true},
		{name: "a member in chain whose pod is not Ready is no live copy", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			w.members("c1", "p-2")
			w.podNotReady(2)
			return w
		}(), waiting: []string{"p-1 (node n1 deleted): chains c1 have no Ready member in chain"}},
		{name: "pod Ready elsewhere: not lost while its pod serves", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			w.in.Pods["p-1"].Spec.NodeName = "n9"
			w.in.Pods["p-1"].Status.Conditions[0].Status = corev1.ConditionTrue
			return w
		}(), waiting: []string{"p-1 (node n1 deleted): its pod is still Ready"}},
		{name: "a pod on the deleted node shows the Ready it last reported", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			w.in.Pods["p-1"].Status.Conditions[0].Status = corev1.ConditionTrue
			return w
		}(), replace: "p-1", podOnNode: true},
		{name: "annotation on the pool turns it off", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			w.in.Pool.Annotations = map[string]string{ReplaceLostReplicasAnnotation: "false"}
			return w
		}(), disabled: true, waiting: []string{"replacement is off (ReplicaPool p has"}},
		{name: "annotation on a Stream of the pool turns it off", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			w.in.Streams = []streamsv1alpha1.Stream{{ObjectMeta: metav1.ObjectMeta{Name: "s", Annotations: map[string]string{ReplaceLostReplicasAnnotation: " False "}}}}
			return w
		}(), disabled: true, waiting: []string{"replacement is off (Stream s has"}},
		{name: "annotation set to anything but false leaves it on", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			w.in.Pool.Annotations = map[string]string{ReplaceLostReplicasAnnotation: "true"}
			return w
		}(), replace: "p-1", podOnNode: true},
		{name: "two nodes lost: one replacement at a time, lowest ordinal first", world: newLossWorld().nodeGone(1).out(1).nodeGone(2).out(2),
			replace: "p-1", podOnNode: true, waiting: []string{"p-2 (node n2 deleted): after p-1"}},
		{name: "a replacement still catching up blocks the next", world: func() *lossWorld {
			w := newLossWorld().nodeGone(2).out(2)
			// p-1 was replaced: its new claim is bound on a live node, and it copies in.
			w.in.Volumes["pv-1"].Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values = []string{"n0"}
			w.members("c0", "p-0", "p-1:CatchingUp")
			return w
		}(), waiting: []string{"p-2 (node n2 deleted): waits for p-1 to be back in their chains"}},
		{name: "a pod restarting on its own volume blocks a replacement", world: newLossWorld().nodeGone(2).out(2).podNotReady(0),
			waiting: []string{"p-2 (node n2 deleted): waits for p-0 to be back"}},
		{name: "a replacement whose new claim does not exist yet blocks the next", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1).nodeGone(2).out(2)
			delete(w.in.Claims, "data-p-1")
			delete(w.in.Pods, "p-1")
			return w
		}(), waiting: []string{"p-2 (node n2 deleted): waits for p-1 to be back"}},
		{name: "every in-chain member of a chain lost: its volumes may hold the last copy", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).nodeGone(2).out(1)
			w.members("c1", "p-2") // c1 runs on p-2 alone, itself lost (not yet detected)
			w.members("c0", "p-0")
			return w
		}(), waiting: []string{"p-1 (node n1 deleted): chains c1 have no Ready member in chain outside lost nodes", "p-2 (node n2 deleted): still listed in chains c1"}},
		{name: "a replacement that stopped half way: its pod still holds the claim being deleted", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			now := metav1.NewTime(lossNow)
			w.in.Claims["data-p-1"].DeletionTimestamp = &now
			return w
		}(), finish: []string{"p-1"}},
		{name: "a replacement that stopped half way blocks the next", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1).nodeGone(2).out(2)
			now := metav1.NewTime(lossNow)
			w.in.Claims["data-p-1"].DeletionTimestamp = &now
			return w
		}(), finish: []string{"p-1"}, waiting: []string{"p-2 (node n2 deleted): waits for p-1"}},
		{name: "a volume not pinned to one node is never lost with a node", world: func() *lossWorld {
			w := newLossWorld().nodeGone(1).out(1)
			w.in.Volumes["pv-1"].Spec.NodeAffinity = nil
			return w
		}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			plan := planNodeLoss(c.world.in)
			got := ""
			if plan.Replace != nil {
				got = plan.Replace.Pod
			}
			if got != c.replace {
				t.Fatalf("replace %q, want %q (waiting %q)", got, c.replace, plan.Waiting)
			}
			if r := plan.Replace; r != nil {
				if r.PodOnNode != c.podOnNode || r.RetainVolume != c.retain || r.Claim != "data-"+r.Pod {
					t.Errorf("replacement %+v: want podOnNode %v, retainVolume %v", *r, c.podOnNode, c.retain)
				}
			}
			if len(plan.Waiting) != len(c.waiting) {
				t.Fatalf("waiting %q, want %d like %q", plan.Waiting, len(c.waiting), c.waiting)
			}
			for i, w := range c.waiting {
				if !strings.Contains(plan.Waiting[i], w) {
					t.Errorf("waiting[%d] = %q, want it to contain %q", i, plan.Waiting[i], w)
				}
			}
			if (plan.Disabled != "") != c.disabled {
				t.Errorf("disabled %q, want %v", plan.Disabled, c.disabled)
			}
			var finish []string
			for _, f := range plan.Finish {
				finish = append(finish, f.Pod)
			}
			if fmt.Sprint(finish) != fmt.Sprint(c.finish) {
				t.Errorf("finish %v, want %v", finish, c.finish)
			}
			want := c.requeueNear
			if want == 0 && len(c.waiting) > 0 {
				want = nodeLossRecheck
			}
			if plan.RequeueAfter < want-time.Second || plan.RequeueAfter > want+time.Second {
				t.Errorf("requeue after %v, want about %v", plan.RequeueAfter, want)
			}
		})
	}
}
