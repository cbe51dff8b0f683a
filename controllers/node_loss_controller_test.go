package controllers

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// TestReconcileNodeLossConfirmsTheOffSwitch: the cache decides a
// replacement, the API server confirms it. Replacement turned off on the
// pool or on one of its Streams just before the node went, while the
// cache still holds the objects without the annotation (separate
// informers: the Node's deletion can arrive first), keeps the replica.
// Seen in the envtest suite: the claim was deleted under a pool annotated
// replace-lost-replicas=false.
func TestReconcileNodeLossConfirmsTheOffSwitch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		offOn     string // "pool", "stream" or "" (replacement on)
		wantClaim bool
	}{
		{"replacement on everywhere: replaced", "", false},
		{"off on the pool, the cache behind: kept", "pool", true},
		{"off on a Stream, the cache behind: kept", "stream", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newLossWorld().nodeGone(1).out(1)
			cached, apiServer := lossWorldObjects(t, w), lossWorldObjects(t, w)
			stream := &streamsv1alpha1.Stream{}
			stream.Namespace, stream.Name, stream.Spec.Pool = "ns", "orders", "p"
			cached = append(cached, stream.DeepCopy())
			off := map[string]string{ReplaceLostReplicasAnnotation: "false"}
			switch tc.offOn {
			case "pool":
				w.in.Pool.Annotations = off
			case "stream":
				stream.Annotations = off
			}
			apiServer = append(apiServer, w.in.Pool.DeepCopy(), stream)
			cached = append(cached, func() client.Object { p := w.in.Pool.DeepCopy(); p.Annotations = nil; return p }())

			scheme := testScheme(t)
			cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(cached...).Build()
			api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(apiServer...).Build()
			r := &ReplicaPoolReconciler{Client: cache, APIReader: api, Scheme: scheme, NodeLoss: &NodeLossOptions{Grace: w.in.Grace}, now: func() time.Time { return lossNow }}

			ctx := context.Background()
			var pool streamsv1alpha1.ReplicaPool
			if err := cache.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p"}, &pool); err != nil {
				t.Fatal(err)
			}
			obs, err := r.observe(ctx, &pool)
			if err != nil {
				t.Fatal(err)
			}
			obs.chains = w.in.Chains
			if _, _, err := r.reconcileNodeLoss(ctx, &pool, obs); err != nil {
				t.Fatal(err)
			}
			err = cache.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "data-p-1"}, &corev1.PersistentVolumeClaim{})
			switch {
			case tc.wantClaim && err != nil:
				t.Errorf("the lost replica's claim was deleted (%v); replacement is off on the API server", err)
			case !tc.wantClaim && !apierrors.IsNotFound(err):
				t.Errorf("the lost replica's claim is still there (%v); it should have been replaced", err)
			}
		})
	}
}

// lossWorldObjects are the pods, claims, volumes and nodes of w as API
// objects of its pool (not the pool itself).
func lossWorldObjects(t *testing.T, w *lossWorld) []client.Object {
	t.Helper()
	labels := poolSelectorLabels(w.in.Pool)
	var objs []client.Object
	for _, p := range w.in.Pods {
		p = p.DeepCopy()
		p.Namespace, p.Labels = "ns", labels
		objs = append(objs, p)
	}
	for _, c := range w.in.Claims {
		c = c.DeepCopy()
		c.Namespace, c.Labels = "ns", labels
		objs = append(objs, c)
	}
	for _, v := range w.in.Volumes {
		objs = append(objs, v.DeepCopy())
	}
	for name, n := range w.in.Nodes {
		n = n.DeepCopy()
		n.Labels = map[string]string{corev1.LabelHostname: name}
		objs = append(objs, n)
	}
	return objs
}
