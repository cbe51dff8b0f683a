package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// ReplicaPoolReconciler keeps a ReplicaPool's StatefulSet, headless Service
// and PodDisruptionBudget as desiredPoolObjects says, and reports the
// StatefulSet's progress in the pool's status.
type ReplicaPoolReconciler struct {
	Client client.Client
	Scheme *runtime.Scheme
	// Image is the container image of replica pods.
	Image string
	// ImagePullSecrets are added to every pod it runs (the chart's
	// imagePullSecrets).
	ImagePullSecrets []string
	// NetworkPolicy, when set, gives each pool a NetworkPolicy; when nil,
	// one the operator made earlier is deleted.
	NetworkPolicy *NetworkPolicyOptions
	// Certificates, when set, issues each pool's replica certificate and
	// runs the replicas with mutual TLS and --allow-* (nil: plaintext).
	Certificates CertificateIssuer
	// NodeLoss, when set, replaces replicas lost with their node (nil:
	// never; the operator then reads no Nodes or PersistentVolumes).
	NodeLoss *NodeLossOptions
	// APIReader reads around the cache: what node loss confirms before it
	// gives a volume up (nil: Client).
	APIReader client.Reader
	// Recorder records Events on ReplicaPools (nil: none).
	Recorder events.EventRecorder
	// now is the clock (nil: time.Now).
	now func() time.Time
}

// +kubebuilder:rbac:groups=streams.catena.io,resources=replicapools,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=streams.catena.io,resources=replicapools/status,verbs=get;update;patch
// Owner references that block deletion need update on the owner's finalizers.
// +kubebuilder:rbac:groups=streams.catena.io,resources=replicapools/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=streams.catena.io,resources=streams;replicationchains,verbs=get;list;watch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// The certificates the operator issues, and its CA.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cert-manager.io,resources=certificates,verbs=get;list;watch;create;update;patch;delete

// Reconcile brings one ReplicaPool's children to their desired state and
// records what its StatefulSet reports and what it hosts.
func (r *ReplicaPoolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (_ reconcile.Result, retErr error) {
	logger := log.FromContext(ctx).WithValues("replicaPool", req.NamespacedName)
	ctx = log.IntoContext(ctx, logger)

	pool := &streamsv1alpha1.ReplicaPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		// Owner references delete the children; nothing else to release.
		return reconcile.Result{}, nil
	}

	// Gather, then act: the status records what was read before applying,
	// and an apply that fails leaves it no less true. A failed read
	// records nothing rather than a status made of zero values.
	before := pool.DeepCopy()
	obs, err := r.observe(ctx, pool)
	if err != nil {
		return reconcile.Result{}, err
	}
	var lossCond *metav1.Condition
	defer func() {
		pool.Status = poolStatus(pool, obs.sts, obs.usage(pool))
		setNodeLossCondition(&pool.Status, pool.Generation, lossCond)
		if err := r.patchStatus(ctx, before, pool); err != nil {
			retErr = kerrors.NewAggregate([]error{retErr, err})
		}
	}()

	desiredSTS, svc, pdb := desiredPoolObjects(pool, r.Image)
	addImagePullSecrets(&desiredSTS.Spec.Template.Spec, r.ImagePullSecrets)
	var res reconcile.Result
	if c := r.Certificates; c != nil {
		// The Secret first: a pod waits for its volume's Secret.
		wake, err := c.ensureLeaf(ctx, pool, pool.TLSSecretName(), poolLeaf(pool), nil)
		if err != nil {
			// No replica runs without it: say why where kubectl
			// describe shows it.
			if r.Recorder != nil {
				r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, "CertificateFailed", "Issue", "replica certificate: %v", err)
			}
			return res, err
		}
		mountTLS(&desiredSTS.Spec.Template.Spec, pool.TLSSecretName(), c.podArgs(replicaAccessArgs(pool, c.OperatorIdentity())...)...)
		res = requeueAt(res, wake, c.now())
	}
	if obs.sts == nil {
		logger.Info("Creating the pool's StatefulSet", "statefulSet", desiredSTS.Name, "replicas", pool.Spec.Replicas)
	}
	for _, obj := range []client.Object{svc, desiredSTS, pdb} {
		if err := applyOwned(ctx, r.Client, r.Scheme, pool, obj); err != nil {
			return res, err
		}
	}
	if err := r.reconcileNetworkPolicy(ctx, pool); err != nil {
		return res, err
	}
	if r.NodeLoss == nil {
		// Off: a condition from when it was on would no longer be kept up.
		meta.RemoveStatusCondition(&pool.Status.Conditions, streamsv1alpha1.ReplicaPoolNodeLossCondition)
		return res, nil
	}
	wake, cond, err := r.reconcileNodeLoss(ctx, pool, obs)
	lossCond = cond
	if wake > 0 && (res.RequeueAfter == 0 || wake < res.RequeueAfter) {
		res.RequeueAfter = wake
	}
	return res, err
}

// reconcileNetworkPolicy applies the pool's NetworkPolicy when they are on,
// and deletes the one it made when they are off.
func (r *ReplicaPoolReconciler) reconcileNetworkPolicy(ctx context.Context, pool *streamsv1alpha1.ReplicaPool) error {
	if r.NetworkPolicy != nil {
		return applyOwned(ctx, r.Client, r.Scheme, pool, desiredNetworkPolicy(pool, *r.NetworkPolicy))
	}
	np := &networkingv1.NetworkPolicy{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: pool.StatefulSetName()}, np); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(np, pool) {
		return nil // not the operator's
	}
	if err := r.Client.Delete(ctx, np); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to delete NetworkPolicy %s now that they are off: %w", np.Name, err)
	}
	return nil
}

// poolObservation is what a pass over a pool reads before it acts.
type poolObservation struct {
	// sts is the pool's StatefulSet (nil when it does not exist).
	sts *appsv1.StatefulSet
	// streams and chains are those hosted on the pool.
	streams []streamsv1alpha1.Stream
	chains  []streamsv1alpha1.ReplicationChain
}

// observe reads the pool's StatefulSet and what the pool hosts.
func (r *ReplicaPoolReconciler) observe(ctx context.Context, pool *streamsv1alpha1.ReplicaPool) (poolObservation, error) {
	var obs poolObservation
	sts := &appsv1.StatefulSet{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: pool.StatefulSetName()}, sts); err != nil {
		if !apierrors.IsNotFound(err) {
			return obs, fmt.Errorf("failed to read StatefulSet %s: %w", pool.StatefulSetName(), err)
		}
		sts = nil
	}
	obs.sts = sts
	streams, err := poolStreams(ctx, r.Client, pool)
	if err != nil {
		return obs, err
	}
	obs.streams = streams
	var chains streamsv1alpha1.ReplicationChainList
	if err := r.Client.List(ctx, &chains, client.InNamespace(pool.Namespace)); err != nil {
		return obs, fmt.Errorf("failed to list the ReplicationChains in %s: %w", pool.Namespace, err)
	}
	for _, c := range chains.Items {
		if c.Spec.Pool == pool.Name {
			obs.chains = append(obs.chains, c)
		}
	}
	return obs, nil
}

// poolStreams are the Streams hosted on the pool, as reader has them.
func poolStreams(ctx context.Context, reader client.Reader, pool *streamsv1alpha1.ReplicaPool) ([]streamsv1alpha1.Stream, error) {
	var streams streamsv1alpha1.StreamList
	if err := reader.List(ctx, &streams, client.InNamespace(pool.Namespace)); err != nil {
		return nil, fmt.Errorf("failed to list the Streams in %s: %w", pool.Namespace, err)
	}
	var on []streamsv1alpha1.Stream
	for _, s := range streams.Items {
		if s.PoolName() == pool.Name {
			on = append(on, s)
		}
	}
	return on, nil
}

// usage is what the pool hosts, for its status.
func (o poolObservation) usage(pool *streamsv1alpha1.ReplicaPool) poolUsage {
	u := poolUsage{Streams: int32(len(o.streams)), Chains: int32(len(o.chains))}
	for _, s := range o.streams {
		if s.Spec.ReplicationFactor > pool.Spec.Replicas {
			u.TooLongChains = append(u.TooLongChains, s.Name)
		}
	}
	slices.Sort(u.TooLongChains)
	return u
}

func (r *ReplicaPoolReconciler) patchStatus(ctx context.Context, before, pool *streamsv1alpha1.ReplicaPool) error {
	if equality.Semantic.DeepEqual(before.Status, pool.Status) {
		return nil
	}
	// With the pool's resourceVersion: a pass that read the pool from a
	// cache not yet holding the previous pass's status (a pod or claim
	// event wakes the pool right after it acted) would write its stale
	// conditions back, and a merge patch replaces the whole list (seen:
	// the NodeLoss message of a replacement overwritten by the previous
	// one's). It fails instead, and the pass runs again on fresh reads.
	if err := r.Client.Status().Patch(ctx, pool, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("failed to patch the status of ReplicaPool %s: %w", pool.Name, err)
	}
	return nil
}

// SetupWithManager registers the reconciler: it watches ReplicaPools, the
// children they own, and the Streams and chains they host. A Stream's pool
// and replicationFactor and a chain's pool are immutable, so only their
// creation and deletion change what a pool hosts.
func (r *ReplicaPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	createOrDelete := builder.WithPredicates(predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }})
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Certificates != nil {
		b = r.Certificates.watchCertificates(b, "ReplicaPool", func(ctx context.Context) ([]reconcile.Request, error) {
			var l streamsv1alpha1.ReplicaPoolList
			err := r.Client.List(ctx, &l)
			return requestsFor(l.Items), err
		})
	}
	if r.NodeLoss != nil {
		// A node going NotReady, Ready or away; a claim deleted or
		// recreated; a replica pod's readiness: each may change what
		// planNodeLoss decides.
		readyChanged := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
			return nodeReady(o) != nodeReady(n) || o.Spec.Unschedulable != n.Spec.Unschedulable
		}}
		b = b.Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			var l streamsv1alpha1.ReplicaPoolList
			if err := r.Client.List(ctx, &l); err != nil {
				log.FromContext(ctx).Error(err, "Failed to list the ReplicaPools for a Node's change")
				return nil
			}
			return requestsFor(l.Items)
		}), builder.WithPredicates(readyChanged)).
			Watches(&corev1.PersistentVolumeClaim{}, handler.EnqueueRequestsFromMapFunc(replicaObjectPool)).
			Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(replicaObjectPool))
	}
	return b.
		For(&streamsv1alpha1.ReplicaPool{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&networkingv1.NetworkPolicy{}).
		Watches(&streamsv1alpha1.Stream{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.(*streamsv1alpha1.Stream).PoolName()}}}
		}), createOrDelete).
		Watches(&streamsv1alpha1.ReplicationChain{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.(*streamsv1alpha1.ReplicationChain).Spec.Pool}}}
		}), createOrDelete).
		Named("replicapool").
		Complete(r)
}

// replicaObjectPool maps a replica pod or claim of a pool to the pool.
func replicaObjectPool(_ context.Context, obj client.Object) []reconcile.Request {
	l := obj.GetLabels()
	if l[labelName] != appName || l[labelComponent] != componentReplica || l[labelInstance] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: l[labelInstance]}}}
}

// nodeReady reports whether a Node's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	c := nodeReadyCondition(n)
	return c != nil && c.Status == corev1.ConditionTrue
}
