package controllers

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/catena-streams/catena/internal/pki"
)

// CertificateIssuer gives the pods the operator runs their certificates,
// in Secrets named after their objects, and the operator its own client
// certificate. Two kinds exist (docs/security.md): the operator's own CA
// (Certificates) and a cert-manager issuer (CertManager). The reconcilers
// see only this surface; every identity they ask for must chain to one
// trust root, which each Secret's ca.crt holds.
type CertificateIssuer interface {
	// Run with the manager, by the leader only.
	manager.Runnable
	manager.LeaderElectionRunnable

	// ClientTLS is the operator's TLS config for its links to replicas
	// and aggregation workers, following renewals.
	ClientTLS() *tls.Config
	// OperatorIdentity is the identity of the operator's certificate.
	OperatorIdentity() string

	// bind gives the issuer the manager's clients, before it starts.
	bind(mgr ctrl.Manager) error
	now() time.Time
	// podArgs are args and what every pod needs besides its access lists.
	podArgs(args ...string) []string
	// watchCertificates makes a controller whose objects own
	// certificates watch them, and reconcile every object all lists when
	// the trust bundle changes.
	watchCertificates(b *builder.Builder, kind string, all func(context.Context) ([]reconcile.Request, error)) *builder.Builder
	// ensureLeaf keeps the Secret name, for owner, holding a certificate
	// for l, and returns when to look again (zero: when something changes).
	ensureLeaf(ctx context.Context, owner client.Object, name string, l pki.Leaf, extraLabels map[string]string) (time.Time, error)
	// ensureBundle keeps the Secret name, controlled by owner, holding
	// only ca.crt, the trust bundle.
	ensureBundle(ctx context.Context, owner client.Object, name string) error
	// pruneLeaves removes owner's leaves labelled selector whose names
	// keep lacks, and their Secrets.
	pruneLeaves(ctx context.Context, owner client.Object, selector map[string]string, keep map[string]bool) error
}

var (
	_ CertificateIssuer = (*Certificates)(nil)
	_ CertificateIssuer = (*CertManager)(nil)
)

// readOwnedSecret reads the Secret name of owner's namespace: found is
// false when there is none; one owner does not control is an error.
func readOwnedSecret(ctx context.Context, c client.Client, owner client.Object, name string) (secret *corev1.Secret, found bool, err error) {
	secret = &corev1.Secret{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: owner.GetNamespace(), Name: name}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return secret, false, nil
		}
		return nil, false, fmt.Errorf("failed to read Secret %s: %w", name, err)
	}
	if !metav1.IsControlledBy(secret, owner) {
		if crt := secret.Annotations[certificateNameAnnotation]; crt != "" {
			return nil, false, fmt.Errorf("secret %s is cert-manager's (Certificate %s, from --certificates=cert-manager): to have the operator's own CA issue it, delete that Certificate and then the Secret", name, crt)
		}
		return nil, false, fmt.Errorf("secret %s exists and is not the operator's for %s: the operator will not overwrite it; delete or rename it", name, owner.GetName())
	}
	return secret, true, nil
}

// writeOwnedSecret creates (found false) or updates a Secret the operator
// writes, controlled by owner.
func writeOwnedSecret(ctx context.Context, c client.Client, scheme *runtime.Scheme, owner client.Object, secret *corev1.Secret, found bool, name string, typ corev1.SecretType, data map[string][]byte, extraLabels map[string]string) error {
	if found {
		secret.Data = data
		if err := c.Update(ctx, secret); err != nil {
			return fmt.Errorf("failed to update Secret %s: %w", name, err)
		}
		return nil
	}
	labels := CertificateLabels()
	maps.Copy(labels, extraLabels)
	secret = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: owner.GetNamespace(), Name: name, Labels: labels},
		Type:       typ,
		Data:       data,
	}
	if err := controllerutil.SetControllerReference(owner, secret, scheme); err != nil {
		return fmt.Errorf("failed to set the owner of Secret %s: %w", name, err)
	}
	if err := c.Create(ctx, secret); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("secret %s exists and is not the operator's for %s (it lacks the labels %v): the operator will not overwrite it; delete or rename it", name, owner.GetName(), CertificateLabels())
		}
		return fmt.Errorf("failed to create Secret %s: %w", name, err)
	}
	return nil
}

// ensureBundleSecret keeps the Secret name, controlled by owner, holding
// only ca.crt = bundle.
func ensureBundleSecret(ctx context.Context, c client.Client, scheme *runtime.Scheme, owner client.Object, name string, bundle []byte) error {
	secret, found, err := readOwnedSecret(ctx, c, owner, name)
	if err != nil {
		return err
	}
	if found && len(secret.Data) == 1 && string(secret.Data[pki.BundleKey]) == string(bundle) {
		return nil
	}
	return writeOwnedSecret(ctx, c, scheme, owner, secret, found, name, corev1.SecretTypeOpaque, map[string][]byte{pki.BundleKey: bundle}, nil)
}

// publishBundleConfigMap keeps the ConfigMap key holding bundle: what a
// scraper (a PodMonitor's tlsConfig) or a client outside the cluster needs
// to verify Catena's servers.
func publishBundleConfigMap(ctx context.Context, c client.Client, reader client.Reader, key types.NamespacedName, bundle []byte) error {
	cm := &corev1.ConfigMap{}
	if err := reader.Get(ctx, key, cm); err != nil {
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("failed to read ConfigMap %s: %w", key, err)
		}
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: CertificateLabels()},
			Data: map[string]string{pki.BundleKey: string(bundle)}}
		if err := c.Create(ctx, cm); err != nil {
			return fmt.Errorf("failed to create ConfigMap %s: %w", key, err)
		}
		return nil
	}
	if cm.Data[pki.BundleKey] == string(bundle) {
		return nil
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[pki.BundleKey] = string(bundle)
	if err := c.Update(ctx, cm); err != nil {
		return fmt.Errorf("failed to update ConfigMap %s: %w", key, err)
	}
	return nil
}

// pruneSecrets deletes the Secrets of owner's namespace labelled selector
// that owner owns (as controller or not) and keep does not name.
func pruneSecrets(ctx context.Context, c client.Client, owner client.Object, selector map[string]string, keep map[string]bool) error {
	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.InNamespace(owner.GetNamespace()), client.MatchingLabels(selector)); err != nil {
		return fmt.Errorf("failed to list %s's certificate Secrets: %w", owner.GetName(), err)
	}
	for i := range secrets.Items {
		s := &secrets.Items[i]
		if keep[s.Name] || !ownedBy(s, owner) {
			continue
		}
		if err := c.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("failed to delete Secret %s: %w", s.Name, err)
		}
		log.FromContext(ctx).Info("Deleted a certificate no longer wanted", "secret", s.Name)
	}
	return nil
}

// ownedBy says whether o has an owner reference to owner.
func ownedBy(o, owner client.Object) bool {
	for _, ref := range o.GetOwnerReferences() {
		if ref.UID == owner.GetUID() {
			return true
		}
	}
	return false
}

// bundleFollowers are the controllers to wake when the trust bundle
// changes: each object that holds a certificate must then carry it.
type bundleFollowers struct {
	mu    sync.Mutex
	chans []chan event.GenericEvent
}

// follow makes the controller b reconcile every object all lists (kind,
// for the log) at each wake.
func (f *bundleFollowers) follow(b *builder.Builder, kind string, all func(context.Context) ([]reconcile.Request, error)) *builder.Builder {
	return b.WatchesRawSource(source.Channel(f.add(), handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		reqs, err := all(ctx)
		if err != nil {
			log.FromContext(ctx).Error(err, "Failed to list the objects whose certificates follow the trust bundle", "kind", kind)
		}
		return reqs
	})))
}

// add is a new follower's channel.
func (f *bundleFollowers) add() chan event.GenericEvent {
	ch := make(chan event.GenericEvent, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.chans = append(f.chans, ch)
	return ch
}

// wake tells every follower; one pending wake is enough.
func (f *bundleFollowers) wake() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.chans {
		select {
		case ch <- event.GenericEvent{}:
		default:
		}
	}
}
