package controllers

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// volumeCleanup is what to do with the volumes of a deleted Stream's own
// pool.
type volumeCleanup struct {
	// Delete names the PersistentVolumeClaims to delete.
	Delete []string
	// Keep says why none are deleted, when that is a choice rather than
	// there being none.
	Keep string
}

// planVolumeCleanup decides which PersistentVolumeClaims a deleted Stream
// takes with it. pool is the ReplicaPool named like the Stream's own (nil
// when it is gone) and claims those carrying the selector labels of that
// pool. Only claims the pool's StatefulSet would have made,
// data-<statefulset>-<i>, are deleted, and none when the pool named like
// the Stream's own belongs to something else: its volumes are not the
// Stream's to delete.
func planVolumeCleanup(stream *streamsv1alpha1.Stream, pool *streamsv1alpha1.ReplicaPool, claims []corev1.PersistentVolumeClaim) volumeCleanup {
	switch {
	case !stream.DeletesVolumes():
		return volumeCleanup{Keep: fmt.Sprintf("volumeReclaimPolicy is %s", stream.Spec.VolumeReclaimPolicy)}
	case !stream.HasOwnPool():
		return volumeCleanup{Keep: fmt.Sprintf("ReplicaPool %s is shared: the Stream's partitions are dropped from its replicas instead", stream.PoolName())}
	case pool != nil && !metav1.IsControlledBy(pool, stream):
		return volumeCleanup{Keep: fmt.Sprintf("ReplicaPool %s is not owned by this Stream", pool.Name)}
	}
	own := &streamsv1alpha1.ReplicaPool{ObjectMeta: metav1.ObjectMeta{Name: stream.OwnPoolName(), Namespace: stream.Namespace}}
	prefix := dataVolumeName + "-" + own.StatefulSetName() + "-"
	var out volumeCleanup
	for i := range claims {
		c := &claims[i]
		if c.Namespace != stream.Namespace || !strings.HasPrefix(c.Name, prefix) || !c.DeletionTimestamp.IsZero() {
			continue
		}
		out.Delete = append(out.Delete, c.Name)
	}
	slices.Sort(out.Delete)
	return out
}

// syncVolumesFinalizer holds the Stream with VolumesFinalizer exactly when
// its volumeReclaimPolicy is Delete, and reports whether it changed the
// Stream (whose update then triggers the next reconcile).
func (r *StreamReconciler) syncVolumesFinalizer(ctx context.Context, stream *streamsv1alpha1.Stream) (bool, error) {
	want := stream.DeletesVolumes()
	if want == controllerutil.ContainsFinalizer(stream, streamsv1alpha1.VolumesFinalizer) {
		return false, nil
	}
	before := stream.DeepCopy()
	if want {
		log.FromContext(ctx).Info("Adding the volumes finalizer", "finalizer", streamsv1alpha1.VolumesFinalizer)
		controllerutil.AddFinalizer(stream, streamsv1alpha1.VolumesFinalizer)
	} else {
		log.FromContext(ctx).Info("Removing the volumes finalizer", "finalizer", streamsv1alpha1.VolumesFinalizer, "reason", "volumeReclaimPolicy is not Delete")
		controllerutil.RemoveFinalizer(stream, streamsv1alpha1.VolumesFinalizer)
	}
	if err := r.patchFinalizers(ctx, before, stream); err != nil {
		return false, err
	}
	return true, nil
}

// finalize releases a deleted Stream: it deletes the claims of the
// Stream's own pool when its policy says so, then lets the Stream go.
// Claims still mounted by a pod are held by Kubernetes' own pvc-protection
// finalizer until the pod is gone, which garbage collection of the pool's
// StatefulSet brings about once the Stream is deleted.
func (r *StreamReconciler) finalize(ctx context.Context, stream *streamsv1alpha1.Stream) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(stream, streamsv1alpha1.VolumesFinalizer) {
		// Owner references delete the children; nothing else to release.
		return reconcile.Result{}, nil
	}
	if !stream.HasOwnPool() && stream.DeletesVolumes() {
		pending, err := r.dropPartitions(ctx, stream)
		if err != nil {
			return reconcile.Result{}, err
		}
		if len(pending) > 0 {
			log.FromContext(ctx).Info("Waiting for replicas to drop the deleted Stream's partitions", "replicaPool", stream.PoolName(), "pending", pending)
			r.event(stream, corev1.EventTypeWarning, "DropPending", "Finalize",
				"Waiting for %s of ReplicaPool %s to drop the Stream's partitions; remove the finalizer %s by hand to leave them there",
				strings.Join(pending, ", "), stream.PoolName(), streamsv1alpha1.VolumesFinalizer)
			return reconcile.Result{RequeueAfter: dropRetryInterval}, nil
		}
	}
	return reconcile.Result{}, r.releaseVolumes(ctx, stream)
}

// releaseVolumes deletes the claims of the Stream's own pool when its policy
// says so, then removes the finalizer.
func (r *StreamReconciler) releaseVolumes(ctx context.Context, stream *streamsv1alpha1.Stream) error {
	logger := log.FromContext(ctx)
	var pool *streamsv1alpha1.ReplicaPool
	if stream.HasOwnPool() {
		p := &streamsv1alpha1.ReplicaPool{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: stream.Namespace, Name: stream.OwnPoolName()}, p)
		switch {
		case err == nil:
			pool = p
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("failed to read ReplicaPool %s: %w", stream.OwnPoolName(), err)
		}
	}
	var claims corev1.PersistentVolumeClaimList
	own := &streamsv1alpha1.ReplicaPool{ObjectMeta: metav1.ObjectMeta{Name: stream.OwnPoolName()}}
	if err := r.Client.List(ctx, &claims, client.InNamespace(stream.Namespace), client.MatchingLabels(poolSelectorLabels(own))); err != nil {
		return fmt.Errorf("failed to list the PersistentVolumeClaims of ReplicaPool %s: %w", own.Name, err)
	}
	plan := planVolumeCleanup(stream, pool, claims.Items)
	if plan.Keep != "" {
		logger.Info("Keeping the volumes of the Stream's pool", "replicaPool", own.Name, "reason", plan.Keep)
	}
	for _, name := range plan.Delete {
		logger.Info("Deleting a volume of the Stream's own pool", "replicaPool", own.Name, "persistentVolumeClaim", name)
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: stream.Namespace, Name: name}}
		if err := r.Client.Delete(ctx, pvc); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("failed to delete PersistentVolumeClaim %s: %w", name, err)
		}
	}
	before := stream.DeepCopy()
	controllerutil.RemoveFinalizer(stream, streamsv1alpha1.VolumesFinalizer)
	return r.patchFinalizers(ctx, before, stream)
}

// patchFinalizers writes the Stream's finalizers. The optimistic lock keeps
// the merge patch, which replaces the whole list, from dropping a
// finalizer someone else added meanwhile. A conflict means the Stream read
// was stale; the change that made it so brings the next reconcile, which
// decides again from the newer Stream.
func (r *StreamReconciler) patchFinalizers(ctx context.Context, before, stream *streamsv1alpha1.Stream) error {
	err := r.Client.Patch(ctx, stream, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsConflict(err):
		log.FromContext(ctx).V(1).Info("The Stream changed meanwhile; deciding again on its next version")
		return nil
	case err != nil:
		return fmt.Errorf("failed to patch the finalizers of Stream %s: %w", stream.Name, err)
	}
	return nil
}

// dropRetryInterval is how soon a deleted Stream's finalizer asks again the
// replicas that have not dropped its partitions yet.
const dropRetryInterval = 5 * time.Second

// dropPartitions asks every replica pod of the Stream's shared pool to drop
// its copy of each of the Stream's partitions, and returns the pods that
// did not answer or still host one. Asking is idempotent: a replica without
// the partition answers at once. Chain controllers stop acting on the
// Stream's chains once it is being deleted; the check after the drops
// catches a Configure that was in flight when the deletion began.
func (r *StreamReconciler) dropPartitions(ctx context.Context, stream *streamsv1alpha1.Stream) ([]string, error) {
	pool := &streamsv1alpha1.ReplicaPool{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: stream.Namespace, Name: stream.PoolName()}, pool); err != nil {
		// The pool is gone, and its volumes with it or in its user's hands.
		return nil, client.IgnoreNotFound(err)
	}
	var chains streamsv1alpha1.ReplicationChainList
	if err := r.Client.List(ctx, &chains, client.InNamespace(stream.Namespace), client.MatchingLabels{labelStream: stream.Name}); err != nil {
		return nil, fmt.Errorf("failed to list the ReplicationChains of Stream %s: %w", stream.Name, err)
	}
	partitions := map[uint32]bool{}
	for p := range uint32(stream.Spec.Partitions) {
		partitions[p] = true
	}
	var members [][]streamsv1alpha1.ChainMember
	for _, c := range chains.Items {
		if c.Spec.Partition != nil {
			partitions[uint32(*c.Spec.Partition)] = true
		}
		members = append(members, c.Status.Members)
	}
	addrs := poolReplicaAddrs(pool, r.ReplicaAddr, members...)
	var pending []string
	for _, pod := range slices.Sorted(maps.Keys(addrs)) {
		if err := r.dropFrom(ctx, stream.Name, addrs[pod], partitions); err != nil {
			log.FromContext(ctx).V(1).Info("A replica did not drop the deleted Stream's partitions", "replica", pod, "error", err.Error())
			pending = append(pending, pod)
		}
	}
	return pending, nil
}

// dropFrom drops every partition of stream from the replica at addr, and
// checks that it hosts none afterwards.
func (r *StreamReconciler) dropFrom(ctx context.Context, stream, addr string, partitions map[uint32]bool) error {
	conn, err := r.Conns.Get(addr)
	if err != nil {
		return err
	}
	rc := catenapb.NewReplicaClient(conn)
	// Each call on its own deadline: a replica hosting many partitions
	// answers many calls.
	hosted := func() ([]*catenapb.PartitionStatus, error) {
		cctx, cancel := context.WithTimeout(ctx, statusProbeTimeout)
		defer cancel()
		resp, err := rc.Status(cctx, &catenapb.StatusRequest{Stream: stream})
		return resp.GetPartitions(), err
	}
	parts, err := hosted()
	if err != nil {
		return err
	}
	// What it hosts (partitions beyond the spec's count included) and what
	// the spec says it might.
	for _, ps := range parts {
		partitions[ps.GetPartition()] = true
	}
	for _, p := range slices.Sorted(maps.Keys(partitions)) {
		cctx, cancel := context.WithTimeout(ctx, statusProbeTimeout)
		_, err := rc.Drop(cctx, &catenapb.DropRequest{Stream: stream, Partition: p, Epoch: math.MaxUint64, StreamDeleted: true})
		cancel()
		if err != nil {
			return err
		}
	}
	if parts, err = hosted(); err != nil {
		return err
	}
	if n := len(parts); n > 0 {
		return fmt.Errorf("still hosts %d partitions", n)
	}
	return nil
}
