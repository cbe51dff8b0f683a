package controllers

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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
	"github.com/catena-streams/catena/rpc/transport"
)

// streamPoolIndex indexes Streams by the ReplicaPool hosting them, so that
// a change of a shared pool wakes the Streams on it.
const streamPoolIndex = "streams.catena.io/hostingPool"

// StreamReconciler creates a Stream's own ReplicaPool (when it names no
// shared one), one Partition and one ReplicationChain per partition, and
// the ingestion Deployment and Service clients connect to, and reports
// their progress in the Stream's status. It does not configure the chains:
// the chain controller does. When the Stream's volumeReclaimPolicy is
// Delete, it deletes the volumes of the Stream's own pool with the Stream.
type StreamReconciler struct {
	Client client.Client
	Scheme *runtime.Scheme
	// Image is the container image of ingestion pods, the operator's own.
	Image string
	// ImagePullSecrets are added to every pod it runs (the chart's
	// imagePullSecrets).
	ImagePullSecrets []string
	// Recorder records Events on Streams (nil: none).
	Recorder events.EventRecorder
	// Conns and ReplicaAddr reach replicas: a deleted Stream whose policy
	// is Delete has its partitions dropped from its shared pool's replicas.
	Conns       *transport.Pool
	ReplicaAddr ReplicaAddrFunc
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Certificates, when set, issues each Stream's ingestion and user
	// certificates and runs ingestion with TLS and spec.access (nil:
	// plaintext, and spec.access is not enforced).
	Certificates CertificateIssuer

	// applied is when each Stream's pool and ingestion objects were last
	// applied whatever their hash: between such re-applies (every
	// reapplyInterval, and at the operator's start) an object is applied
	// only when what the operator would apply changed. A Stream reconciles
	// on every change of its chains' conditions: a failover of hundreds
	// of chains must not cost four applies each time.
	applied stamps
}

// reapplyInterval bounds how long a hand edit of a field the operator owns
// on a Stream's pool, ingestion Deployment, Service or PodDisruptionBudget
// stays before the operator applies the field back.
const reapplyInterval = 5 * time.Minute

func (r *StreamReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// reapplyDue reports whether the Stream's objects are due an apply whatever
// their hash.
func (r *StreamReconciler) reapplyDue(key types.NamespacedName) bool {
	at := r.applied.get(key)
	return at.IsZero() || r.now().Sub(at) >= reapplyInterval
}

func (r *StreamReconciler) event(stream *streamsv1alpha1.Stream, eventType, reason, action, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(stream, nil, eventType, reason, action, note, args...)
	}
}

// +kubebuilder:rbac:groups=streams.catena.io,resources=streams,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=streams.catena.io,resources=streams/status,verbs=get;update;patch
// Owner references that block deletion need update on the owner's finalizers.
// +kubebuilder:rbac:groups=streams.catena.io,resources=streams/finalizers,verbs=update
// +kubebuilder:rbac:groups=streams.catena.io,resources=partitions,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=streams.catena.io,resources=replicationchains,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// Deleting a Stream whose volumeReclaimPolicy is Delete deletes its pool's claims.
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;delete

// Reconcile brings one Stream's children into existence and records what
// it observed.
func (r *StreamReconciler) Reconcile(ctx context.Context, req reconcile.Request) (_ reconcile.Result, retErr error) {
	logger := log.FromContext(ctx).WithValues("stream", req.NamespacedName)
	ctx = log.IntoContext(ctx, logger)

	stream := &streamsv1alpha1.Stream{}
	if err := r.Client.Get(ctx, req.NamespacedName, stream); err != nil {
		if apierrors.IsNotFound(err) {
			r.applied.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !stream.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, stream)
	}
	if changed, err := r.syncVolumesFinalizer(ctx, stream); err != nil || changed {
		return reconcile.Result{}, err
	}

	before := stream.DeepCopy()
	var obs streamObservation
	defer func() {
		if retErr != nil {
			// obs is partial: a failed list would read as missing
			// children. The error requeues; the next pass records status.
			return
		}
		stream.Status = streamStatus(stream, obs)
		if err := r.patchStatus(ctx, before, stream); err != nil {
			retErr = kerrors.NewAggregate([]error{retErr, err})
		}
	}()

	desired := desiredStreamChildren(stream)
	started := r.now()
	obs.reapply = r.reapplyDue(req.NamespacedName)
	// Certificates first: nothing they need comes from the steps below,
	// and a step that fails must not hold back a CA bundle or a user's
	// removal.
	res := reconcile.Result{RequeueAfter: reapplyInterval}
	if c := r.Certificates; c != nil {
		wake, err := r.reconcileCertificates(ctx, stream)
		if err != nil {
			return reconcile.Result{}, err
		}
		res = requeueAt(res, wake, c.now())
	}
	pool, err := r.reconcilePool(ctx, stream, desired.Pool, &obs)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.reconcilePartitions(ctx, stream, desired.Partitions, &obs); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.reconcileChains(ctx, stream, desired.Chains, &obs); err != nil {
		return reconcile.Result{}, err
	}
	ingest := desiredIngestion(stream, pool, r.Image)
	if ingest.Deployment != nil {
		addImagePullSecrets(&ingest.Deployment.Spec.Template.Spec, r.ImagePullSecrets)
	}
	if c := r.Certificates; c != nil {
		if ingest.Deployment != nil {
			args := append(ingestAccessArgs(stream, c.OperatorIdentity()), ingestKafkaTLSArgs(stream)...)
			mountTLS(&ingest.Deployment.Spec.Template.Spec, stream.IngestTLSSecretName(), c.podArgs(args...)...)
		}
	} else if stream.Spec.Access != nil && obs.reapply {
		r.event(stream, corev1.EventTypeWarning, "AccessNotEnforced", "Run",
			"spec.access is not enforced: the operator runs without certificates (--certificates=none), so ingestion cannot tell one client from another")
	}
	if err := r.reconcileIngestion(ctx, stream, ingest, &obs); err != nil {
		return reconcile.Result{}, err
	}
	if obs.reapply {
		r.applied.set(req.NamespacedName, started)
	}
	return res, nil
}

// reconcileCertificates keeps the Stream's Secrets: its ingestion pods'
// certificate, the CA bundle for its clients, and a client certificate
// per user of spec.access; a user no longer listed loses its Secret first.
// It returns when the next renewal is due. A user's certificate that
// cannot be issued (a Secret of its name in the way) is reported as an
// Event and does not hold back the others, nor the ingestion pods' access
// lists, which do not depend on it.
func (r *StreamReconciler) reconcileCertificates(ctx context.Context, stream *streamsv1alpha1.Stream) (time.Time, error) {
	c := r.Certificates
	want := map[string]bool{}
	if a := stream.Spec.Access; a != nil {
		for _, u := range a.Users {
			want[stream.UserSecretName(u.Name)] = true
		}
	}
	userLabels := map[string]string{labelStream: stream.Name, labelInstance: stream.Name}
	selector := CertificateLabels()
	maps.Copy(selector, userLabels)
	if err := c.pruneLeaves(ctx, stream, selector, want); err != nil {
		return time.Time{}, fmt.Errorf("failed to remove the certificates of users no longer in spec.access: %w", err)
	}

	wake, err := c.ensureLeaf(ctx, stream, stream.IngestTLSSecretName(), ingestLeaf(stream), nil)
	if err != nil {
		// Nothing of the Stream runs without it, and its status is not
		// written on a failed pass: say why where kubectl describe shows it.
		r.event(stream, corev1.EventTypeWarning, "CertificateFailed", "Issue", "ingestion certificate: %v", err)
		return time.Time{}, err
	}
	if err := c.ensureBundle(ctx, stream, stream.CABundleName()); err != nil {
		return time.Time{}, err
	}
	if a := stream.Spec.Access; a != nil {
		for _, u := range a.Users {
			w, err := c.ensureLeaf(ctx, stream, stream.UserSecretName(u.Name), userLeaf(stream, u.Name), userLabels)
			if err != nil {
				if ctx.Err() != nil {
					return time.Time{}, err
				}
				r.event(stream, corev1.EventTypeWarning, "UserCertificateFailed", "Issue", "user %s: %v", u.Name, err)
				log.FromContext(ctx).Error(err, "Failed to issue a user's certificate", "user", u.Name)
				continue
			}
			if w.Before(wake) {
				wake = w
			}
		}
	}
	return wake, nil
}

// reconcilePool applies the Stream's own pool, unless its name is taken by
// a pool the Stream does not control, and reads the pool hosting the
// Stream. It returns that pool, or nil when it does not exist or is not
// the Stream's to use.
func (r *StreamReconciler) reconcilePool(ctx context.Context, stream *streamsv1alpha1.Stream, own *streamsv1alpha1.ReplicaPool, obs *streamObservation) (*streamsv1alpha1.ReplicaPool, error) {
	pool := &streamsv1alpha1.ReplicaPool{}
	key := types.NamespacedName{Namespace: stream.Namespace, Name: stream.PoolName()}
	err := r.Client.Get(ctx, key, pool)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("failed to read ReplicaPool %s: %w", key.Name, err)
	}
	found := err == nil
	if own != nil {
		if found && !metav1.IsControlledBy(pool, stream) {
			obs.PoolFound, obs.PoolOwned = true, false
			log.FromContext(ctx).Info("Own pool name is taken by another ReplicaPool", "replicaPool", key.Name, "reason", streamsv1alpha1.StreamPoolConflictReason)
			return nil, nil
		}
		if !found {
			log.FromContext(ctx).Info("Creating own pool", "replicaPool", key.Name)
		}
		hash, err := stampHash(own)
		if err != nil {
			return nil, err
		}
		if !found || obs.reapply || !appliedAlready(pool, hash) {
			if err := applyOwned(ctx, r.Client, r.Scheme, stream, own); err != nil {
				return nil, err
			}
		}
		if !found {
			pool = own // applied just now: no status yet
		}
		found = true
		obs.PoolOwned = true
	}
	obs.PoolFound = found
	if !found {
		return nil, nil
	}
	obs.PoolReplicas = pool.Spec.Replicas
	obs.PoolReady = pool.IsReady()
	return pool, nil
}

// reconcilePartitions creates the Partitions that are missing. Their spec
// is immutable, so existing ones are left alone.
func (r *StreamReconciler) reconcilePartitions(ctx context.Context, stream *streamsv1alpha1.Stream, desired []*streamsv1alpha1.Partition, obs *streamObservation) error {
	var list streamsv1alpha1.PartitionList
	if err := r.Client.List(ctx, &list, client.InNamespace(stream.Namespace), client.MatchingLabels{labelStream: stream.Name}); err != nil {
		return fmt.Errorf("failed to list the Partitions of Stream %s: %w", stream.Name, err)
	}
	existing := make(map[string]bool, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		if !metav1.IsControlledBy(p, stream) {
			continue
		}
		existing[p.Name] = true
		if p.IsReady() {
			obs.PartitionsReady++
		}
	}
	obs.Partitions = int32(len(existing))
	for _, p := range desired {
		if existing[p.Name] {
			continue
		}
		if err := applyOwned(ctx, r.Client, r.Scheme, stream, p); err != nil {
			return err
		}
		obs.Partitions++
	}
	return nil
}

// reconcileChains creates the ReplicationChains that are missing, with no
// members: the chain controller places them.
func (r *StreamReconciler) reconcileChains(ctx context.Context, stream *streamsv1alpha1.Stream, desired []*streamsv1alpha1.ReplicationChain, obs *streamObservation) error {
	var list streamsv1alpha1.ReplicationChainList
	if err := r.Client.List(ctx, &list, client.InNamespace(stream.Namespace), client.MatchingLabels{labelStream: stream.Name}); err != nil {
		return fmt.Errorf("failed to list the ReplicationChains of Stream %s: %w", stream.Name, err)
	}
	existing := make(map[string]bool, len(list.Items))
	slices.SortFunc(list.Items, func(a, b streamsv1alpha1.ReplicationChain) int { return cmp.Compare(a.Name, b.Name) })
	for i := range list.Items {
		c := &list.Items[i]
		if !metav1.IsControlledBy(c, stream) {
			continue
		}
		existing[c.Name] = true
		if d := meta.FindStatusCondition(c.Status.Conditions, streamsv1alpha1.ReplicationChainDegradedCondition); d != nil && d.Status == metav1.ConditionTrue {
			obs.ShortChains = append(obs.ShortChains, c.Name+": "+d.Message)
		}
		if meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainProgressingCondition) {
			obs.Reconfiguring = append(obs.Reconfiguring, c.Name)
		}
	}
	obs.Chains = int32(len(existing))
	for _, c := range desired {
		if existing[c.Name] {
			continue
		}
		if err := applyOwned(ctx, r.Client, r.Scheme, stream, c); err != nil {
			return err
		}
		obs.Chains++
	}
	return nil
}

// reconcileIngestion applies the Stream's ingestion Deployment, Service and
// PodDisruptionBudget, leaving alone any whose name is taken by an object
// the Stream does not control, and reads the Deployment's availability.
// Without a pool to point it at (want.Deployment nil), an existing
// Deployment is kept as it is.
func (r *StreamReconciler) reconcileIngestion(ctx context.Context, stream *streamsv1alpha1.Stream, want ingestion, obs *streamObservation) error {
	svc := &corev1.Service{}
	ok, err := r.applyUnlessTaken(ctx, stream, want.Service, svc, obs)
	if err != nil {
		return err
	}
	obs.IngestServiceFound = ok

	deploy := &appsv1.Deployment{}
	if want.Deployment != nil {
		ok, err = r.applyUnlessTaken(ctx, stream, want.Deployment, deploy, obs)
	} else {
		_, ok, err = r.readControlled(ctx, stream, types.NamespacedName{Namespace: stream.Namespace, Name: stream.IngestName()}, "Deployment", deploy, obs)
	}
	if err != nil {
		return err
	}
	obs.IngestionFound = ok
	if ok {
		// As read before the apply: a Deployment created just now has no
		// status yet, which is zero available replicas.
		obs.IngestionAvailable = deploy.Status.AvailableReplicas
	}

	if _, err = r.applyUnlessTaken(ctx, stream, want.PDB, &policyv1.PodDisruptionBudget{}, obs); err != nil {
		return err
	}
	if err := r.reconcileKafka(ctx, stream, want, obs); err != nil {
		return err
	}
	return r.reconcileExternal(ctx, stream, want.External, obs)
}

// reconcileKafka applies the brokers' headless Service and the groups'
// offsets Stream of a Stream with a Kafka listener; without one, it
// deletes the Service the Stream made and keeps the offsets Stream (the
// groups' offsets are there when Kafka is turned on again).
func (r *StreamReconciler) reconcileKafka(ctx context.Context, stream *streamsv1alpha1.Stream, want ingestion, obs *streamObservation) error {
	if want.Brokers == nil {
		svc := &corev1.Service{}
		key := types.NamespacedName{Namespace: stream.Namespace, Name: stream.KafkaServiceName()}
		if err := r.Client.Get(ctx, key, svc); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !metav1.IsControlledBy(svc, stream) {
			return nil
		}
		log.FromContext(ctx).Info("Deleting the Stream's Kafka brokers Service: spec.ingestion.kafka is off", "name", key.Name)
		return client.IgnoreNotFound(r.Client.Delete(ctx, svc))
	}
	if _, err := r.applyUnlessTaken(ctx, stream, want.Brokers, &corev1.Service{}, obs); err != nil {
		return err
	}
	ok, err := r.applyUnlessTaken(ctx, stream, want.Groups, &streamsv1alpha1.Stream{}, obs)
	obs.KafkaReady = ok && obs.IngestServiceFound
	return err
}

// reconcileExternal applies the Stream's external Service and reads the
// address it gives clients outside the cluster; without an external
// listener, it deletes the one the Stream made.
func (r *StreamReconciler) reconcileExternal(ctx context.Context, stream *streamsv1alpha1.Stream, want *corev1.Service, obs *streamObservation) error {
	name := stream.IngestServiceName() + externalServiceSuffix
	svc := &corev1.Service{}
	if want == nil {
		// Not readControlled: a Service of that name that is not the
		// Stream's (another Stream's, named <stream>-external) is no
		// conflict of a Stream that asks for no external listener.
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: stream.Namespace, Name: name}, svc); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !metav1.IsControlledBy(svc, stream) {
			return nil
		}
		log.FromContext(ctx).Info("Deleting the Stream's external Service: spec.ingestion.external is gone", "name", name)
		return client.IgnoreNotFound(r.Client.Delete(ctx, svc))
	}
	ok, err := r.applyUnlessTaken(ctx, stream, want, svc, obs)
	if err != nil || !ok || svc.Name == "" {
		// Created just now: its port and address come with the next
		// round (the Service's creation wakes the Stream).
		return err
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(stream.Namespace), client.MatchingLabels(ingestSelectorLabels(stream))); err != nil {
		return fmt.Errorf("failed to list the ingestion pods of Stream %s: %w", stream.Name, err)
	}
	obs.External = externalEndpoint(stream.Spec.Ingestion.External, svc, ingestHosts(pods.Items), stream.Status.Endpoints.External)
	return nil
}

// applyUnlessTaken reads the object named like desired into current and
// applies desired, unless an object the Stream does not control holds the
// name. It reports whether the Stream's object exists now.
func (r *StreamReconciler) applyUnlessTaken(ctx context.Context, stream *streamsv1alpha1.Stream, desired, current client.Object, obs *streamObservation) (bool, error) {
	key := client.ObjectKeyFromObject(desired)
	kind := kindOf(desired)
	exists, controlled, err := r.readControlled(ctx, stream, key, kind, current, obs)
	if err != nil || (exists && !controlled) {
		return false, err
	}
	if !exists {
		log.FromContext(ctx).Info("Creating the Stream's ingestion "+kind, "name", key.Name)
	}
	hash, err := stampHash(desired)
	if err != nil {
		return false, err
	}
	if exists && !obs.reapply && appliedAlready(current, hash) {
		return true, nil
	}
	if err := applyOwned(ctx, r.Client, r.Scheme, stream, desired); err != nil {
		return false, err
	}
	return true, nil
}

// readControlled reads key into obj and reports whether it exists and
// whether the Stream controls it. One that exists under another
// controller, or none, is recorded in obs as a conflict: applying over it
// would take over something that is not the Stream's.
func (r *StreamReconciler) readControlled(ctx context.Context, stream *streamsv1alpha1.Stream, key types.NamespacedName, kind string, obj client.Object, obs *streamObservation) (exists, controlled bool, _ error) {
	if err := r.Client.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return false, false, nil
		}
		return false, false, fmt.Errorf("failed to read %s %s: %w", kind, key.Name, err)
	}
	if !metav1.IsControlledBy(obj, stream) {
		obs.IngestionConflict = kind + " " + key.Name
		log.FromContext(ctx).Info("The name of an ingestion object is taken", "object", obs.IngestionConflict, "reason", streamsv1alpha1.StreamIngestionConflictReason)
		return true, false, nil
	}
	return true, true, nil
}

func (r *StreamReconciler) patchStatus(ctx context.Context, before, stream *streamsv1alpha1.Stream) error {
	if equality.Semantic.DeepEqual(before.Status, stream.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, stream, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("failed to patch the status of Stream %s: %w", stream.Name, err)
	}
	return nil
}

// SetupWithManager registers the reconciler: it watches Streams, the
// Partitions, ReplicationChains and ingestion objects they own, and the
// pools hosting them
// (their own pool included, through the same index).
func (r *StreamReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &streamsv1alpha1.Stream{}, streamPoolIndex, func(obj client.Object) []string {
		return []string{obj.(*streamsv1alpha1.Stream).PoolName()}
	}); err != nil {
		return fmt.Errorf("failed to index Streams by pool: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr)
	if r.Certificates != nil {
		b = r.Certificates.watchCertificates(b, "Stream", func(ctx context.Context) ([]reconcile.Request, error) {
			var l streamsv1alpha1.StreamList
			err := r.Client.List(ctx, &l)
			return requestsFor(l.Items), err
		})
	}
	return b.
		For(&streamsv1alpha1.Stream{}).
		// Partitions and chains change status as they run (offsets,
		// holds, every confirmation of a failover): the Stream looks only
		// at the changes its status is made of.
		Owns(&streamsv1alpha1.Partition{}, builder.WithPredicates(predicate.TypedFuncs[client.Object]{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return partitionChangeMatters(e.ObjectOld.(*streamsv1alpha1.Partition), e.ObjectNew.(*streamsv1alpha1.Partition))
			},
		})).
		Owns(&streamsv1alpha1.ReplicationChain{}, builder.WithPredicates(predicate.TypedFuncs[client.Object]{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return chainChangeMatters(e.ObjectOld.(*streamsv1alpha1.ReplicationChain), e.ObjectNew.(*streamsv1alpha1.ReplicationChain))
			},
		})).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Watches(&streamsv1alpha1.ReplicaPool{}, handler.EnqueueRequestsFromMapFunc(r.streamsOnPool)).
		// An ingestion pod becoming Ready (or going) moves the node an
		// external NodePort listener is reported on.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(ingestPodsStream), builder.WithPredicates(predicate.TypedFuncs[client.Object]{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return podReady(e.ObjectOld.(*corev1.Pod)) != podReady(e.ObjectNew.(*corev1.Pod))
			},
		})).
		Named("stream").
		Complete(r)
}

// streamsOnPool maps a ReplicaPool to the Streams it hosts.
func (r *StreamReconciler) streamsOnPool(ctx context.Context, obj client.Object) []reconcile.Request {
	var list streamsv1alpha1.StreamList
	if err := r.Client.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{streamPoolIndex: obj.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "Failed to list the Streams on a pool", "replicaPool", obj.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, s := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
	}
	return reqs
}

// ingestPodsStream maps an ingestion pod to its Stream, for Streams with
// an external listener (the others' status does not depend on their pods).
func ingestPodsStream(_ context.Context, obj client.Object) []reconcile.Request {
	l := obj.GetLabels()
	if l[labelName] != appName || l[labelComponent] != componentIngest || l[labelInstance] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: l[labelInstance]}}}
}
