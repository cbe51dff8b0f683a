package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"reflect"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/catena-streams/catena/internal/pki"
	"github.com/catena-streams/catena/rpc/transport"
)

// certificateGVK is cert-manager's Certificate. The operator handles it
// unstructured: importing cert-manager's API module would tie the
// operator's Kubernetes libraries to cert-manager's.
var certificateGVK = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"}

// DefaultOperatorCertificate names the Certificate, and its Secret, of the
// operator's own identity in cert-manager mode, in the operator's
// namespace.
const DefaultOperatorCertificate = "catena-operator-tls"

// IssuerRef names the cert-manager issuer that signs every certificate:
// Kind Issuer (one of that name in each namespace the operator runs pods
// in, and in its own) or ClusterIssuer.
type IssuerRef struct {
	Name, Kind, Group string
}

// CertManager has cert-manager issue the certificates: for each Secret the
// operator's own CA would write, a cert-manager Certificate of the same
// name, controlled by the same object, whose Secret cert-manager keeps and
// renews (renewBeforePercentage 33: at two thirds of its life, a new key
// each time). The operator's own identity is a Certificate in its
// namespace, whose Secret it reads into memory. Every Secret's ca.crt is
// the trust bundle, so the issuer must return its CA (cert-manager's CA
// and Vault issuers do; ACME issuers do not) and every Issuer must sign
// under the same root (docs/security.md).
type CertManager struct {
	// Client writes Certificates; Cache reads operands' ones from the
	// informer the controllers' Owns runs (the client would read
	// unstructured objects from the API server on every reconcile; nil:
	// Client); Reader reads the operator's own, and Secrets the cache
	// does not hold.
	Client client.Client
	Cache  client.Reader
	Reader client.Reader
	Scheme *runtime.Scheme
	Issuer IssuerRef
	// Namespace is the operator's; OperatorCertificate names its
	// Certificate there, BundleConfigMap the ConfigMap that publishes the
	// trust bundle.
	Namespace, OperatorCertificate, BundleConfigMap string
	LeafLifetime                                    time.Duration
	MetricsTLS                                      bool
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	once   sync.Once
	loaded chan struct{} // closed at the operator's certificate's first load

	mu     sync.Mutex
	own    *tls.Certificate
	roots  *x509.CertPool
	bundle []byte
	// lastErr is why the operator's certificate could not be loaded at
	// the last try (nil: none, or loaded).
	lastErr error
	// followers are woken when the bundle changes.
	followers bundleFollowers
}

func (c *CertManager) init() {
	c.once.Do(func() { c.loaded = make(chan struct{}) })
}

func (c *CertManager) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// bind takes the manager's clients, and refuses to start without
// cert-manager's CRDs.
func (c *CertManager) bind(mgr ctrl.Manager) error {
	c.Client, c.Cache, c.Reader, c.Scheme = mgr.GetClient(), mgr.GetCache(), mgr.GetAPIReader(), mgr.GetScheme()
	if _, err := mgr.GetRESTMapper().RESTMapping(certificateGVK.GroupKind(), certificateGVK.Version); err != nil {
		return fmt.Errorf("--certificates=cert-manager needs cert-manager installed (its CRD %s): %w", certificateGVK, err)
	}
	return nil
}

// cached reads operands' Certificates.
func (c *CertManager) cached() client.Reader {
	if c.Cache != nil {
		return c.Cache
	}
	return c.Client
}

// NeedLeaderElection: only the leader writes Certificates.
func (c *CertManager) NeedLeaderElection() bool { return true }

func (c *CertManager) OperatorIdentity() string { return OperatorIdentity(c.Namespace) }

func (c *CertManager) podArgs(args ...string) []string {
	if c.MetricsTLS {
		return append(args, "--metrics-tls")
	}
	return args
}

// ClientTLS is the operator's TLS config: the certificate cert-manager
// keeps in the operator's Secret, and its ca.crt as the roots. Before the
// first is issued, handshakes fail (and are retried).
func (c *CertManager) ClientTLS() *tls.Config {
	return transport.DynamicConfig(func() (*tls.Certificate, *x509.CertPool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.own == nil {
			return &tls.Certificate{}, x509.NewCertPool()
		}
		return c.own, c.roots
	})
}

// Start keeps the operator's Certificate and loads its Secret until ctx
// ends: every 10 s until cert-manager has issued it, then every minute
// (renewals leave a third of the old certificate's life to be seen).
func (c *CertManager) Start(ctx context.Context) error {
	c.init()
	key := types.NamespacedName{Namespace: c.Namespace, Name: c.OperatorCertificate}
	logger := log.FromContext(ctx).WithValues("certificate", key.String())
	for {
		wait := time.Minute
		loaded, err := c.syncOwn(ctx, key)
		c.mu.Lock()
		c.lastErr = err
		c.mu.Unlock()
		switch {
		case err != nil:
			logger.Error(err, "Failed to keep the operator's certificate; retrying")
			wait = 10 * time.Second
		case !loaded:
			logger.Info("Waiting for cert-manager to issue the operator's certificate", "issuer", c.Issuer.Kind+"/"+c.Issuer.Name)
			wait = 10 * time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// syncOwn applies the operator's Certificate, loads its Secret when
// cert-manager has issued it, and publishes the bundle.
func (c *CertManager) syncOwn(ctx context.Context, key types.NamespacedName) (bool, error) {
	want := desiredCertificate(key, pki.Leaf{Identity: c.OperatorIdentity()}, c.Issuer, c.LeafLifetime, CertificateLabels())
	if err := c.applyCertificate(ctx, c.Reader, nil, want); err != nil {
		return false, err
	}
	secret := &corev1.Secret{}
	if err := c.Reader.Get(ctx, key, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("failed to read Secret %s: %w", key, err)
	}
	bundle := secret.Data[pki.BundleKey]
	if len(bundle) == 0 {
		return false, fmt.Errorf("secret %s has no %s: the issuer %s/%s does not return its CA, which every pod needs to verify the others (use a CA or Vault issuer)", key, pki.BundleKey, c.Issuer.Kind, c.Issuer.Name)
	}
	pair, err := tls.X509KeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return false, fmt.Errorf("secret %s does not hold a certificate and key: %w", key, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return false, fmt.Errorf("secret %s: %s holds no PEM certificate", key, pki.BundleKey)
	}
	c.load(&pair, roots, bundle)
	return true, publishBundleConfigMap(ctx, c.Client, c.Reader, types.NamespacedName{Namespace: c.Namespace, Name: c.BundleConfigMap}, bundle)
}

// load makes pair the operator's certificate and bundle the trust, waking
// the followers when the bundle changed.
func (c *CertManager) load(pair *tls.Certificate, roots *x509.CertPool, bundle []byte) {
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	first, changed := c.own == nil, string(c.bundle) != string(bundle)
	c.own, c.roots, c.bundle = pair, roots, bundle
	switch {
	case first:
		close(c.loaded)
	case changed:
		c.followers.wake()
	}
}

// bundleIfLoaded is the trust bundle, nil before the first load.
func (c *CertManager) bundleIfLoaded() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bundle
}

// currentBundle returns the trust bundle, waiting for its first load; at
// once with the reason when the last try to load it failed (an issuer that
// gives no ca.crt must not hold every reconcile for the wait).
func (c *CertManager) currentBundle(ctx context.Context) ([]byte, error) {
	c.init()
	c.mu.Lock()
	bundle, lastErr := c.bundle, c.lastErr
	c.mu.Unlock()
	if bundle == nil && lastErr != nil {
		return nil, fmt.Errorf("the operator's own certificate from cert-manager cannot be used yet: %w", lastErr)
	}
	select {
	case <-c.loaded:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("cert-manager has not issued the operator's certificate yet (Certificate %s/%s: see its status and the issuer's)", c.Namespace, c.OperatorCertificate)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bundle, nil
}

// watchCertificates: objects own their Certificates (a change of status is
// seen), and their Secrets (deleted by hand: cert-manager issues again,
// and the owner reference is put back), and follow the bundle.
func (c *CertManager) watchCertificates(b *builder.Builder, kind string, all func(context.Context) ([]reconcile.Request, error)) *builder.Builder {
	return c.followers.follow(b.Owns(newCertificate()).Owns(&corev1.Secret{}, builder.MatchEveryOwner), kind, all)
}

// certificateNameAnnotation is what cert-manager writes on each Secret it
// issues: the name of the Certificate it issued it for.
const certificateNameAnnotation = "cert-manager.io/certificate-name"

// adoptRecheck is how soon a leaf is looked at again while its Secret is
// not cert-manager's yet: its creation names no owner to wake.
const adoptRecheck = 5 * time.Second

// ensureLeaf keeps a Certificate name, controlled by owner, asking for l;
// cert-manager keeps its Secret, which the operator makes owner's too (so
// that it goes with owner). Renewal is cert-manager's: the wake is only to
// see a Secret not issued yet.
//
// cert-manager writes over any Secret of the Certificate's name, so the
// Secret is looked at first: one that is neither cert-manager's for this
// Certificate nor owner's is refused, as the own CA refuses it. One the
// own CA wrote for owner (a switch of issuer) loses its controller
// reference first: with --enable-certificate-owner-ref cert-manager makes
// the Certificate the Secret's controller, and the API server refuses a
// second.
func (c *CertManager) ensureLeaf(ctx context.Context, owner client.Object, name string, l pki.Leaf, extraLabels map[string]string) (time.Time, error) {
	labels := CertificateLabels()
	maps.Copy(labels, extraLabels)
	key := types.NamespacedName{Namespace: owner.GetNamespace(), Name: name}
	secret, found, err := c.readSecret(ctx, key)
	if err != nil {
		return time.Time{}, err
	}
	issued := found && secret.Annotations[certificateNameAnnotation] == name
	if found && !issued && !ownedBy(secret, owner) {
		return time.Time{}, fmt.Errorf("secret %s exists and is neither cert-manager's for Certificate %s nor the operator's for %s: cert-manager would write over it, so the operator asks for no certificate there; delete or rename it", name, name, owner.GetName())
	}
	if found && metav1.IsControlledBy(secret, owner) {
		if err := c.setOwner(ctx, owner, secret); err != nil {
			return time.Time{}, err
		}
	}
	if err := c.applyCertificate(ctx, c.cached(), owner, desiredCertificate(key, l, c.Issuer, c.LeafLifetime, labels)); err != nil {
		return time.Time{}, err
	}
	if !issued {
		return c.now().Add(adoptRecheck), nil
	}
	if !ownedBy(secret, owner) {
		if err := c.setOwner(ctx, owner, secret); err != nil {
			return time.Time{}, err
		}
	}
	if bundle := c.bundleIfLoaded(); bundle != nil && string(secret.Data[pki.BundleKey]) != string(bundle) {
		log.FromContext(ctx).Error(nil, "A certificate's ca.crt is not the operator's trust bundle: its pods and the operator will not trust each other (every issuer must sign under the root of the operator's own certificate)",
			"secret", name, "issuer", c.Issuer.Kind+"/"+c.Issuer.Name)
	}
	return time.Time{}, nil
}

// readSecret reads the Secret key: from the cache, which holds those with
// the operator's labels (cert-manager's secretTemplate puts them on), and
// else past it, to see a Secret someone else put there.
func (c *CertManager) readSecret(ctx context.Context, key types.NamespacedName) (*corev1.Secret, bool, error) {
	secret := &corev1.Secret{}
	err := c.Client.Get(ctx, key, secret)
	if apierrors.IsNotFound(err) {
		err = c.Reader.Get(ctx, key, secret)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("failed to read Secret %s: %w", key.Name, err)
	}
	return secret, true, nil
}

// setOwner makes owner a plain owner of secret, never its controller (see
// ensureLeaf), so that the Secret goes with owner.
func (c *CertManager) setOwner(ctx context.Context, owner client.Object, secret *corev1.Secret) error {
	refs := secret.GetOwnerReferences()
	for i := range refs {
		if refs[i].UID == owner.GetUID() {
			refs[i].Controller = nil
		}
	}
	secret.SetOwnerReferences(refs)
	if err := controllerutil.SetOwnerReference(owner, secret, c.Scheme); err != nil {
		return fmt.Errorf("failed to make %s the owner of Secret %s: %w", owner.GetName(), secret.Name, err)
	}
	if err := c.Client.Update(ctx, secret); err != nil {
		return fmt.Errorf("failed to make %s the owner of Secret %s: %w", owner.GetName(), secret.Name, err)
	}
	return nil
}

// ensureBundle keeps the Secret name holding only the trust bundle.
func (c *CertManager) ensureBundle(ctx context.Context, owner client.Object, name string) error {
	bundle, err := c.currentBundle(ctx)
	if err != nil {
		return err
	}
	return ensureBundleSecret(ctx, c.Client, c.Scheme, owner, name, bundle)
}

// pruneLeaves deletes owner's Certificates labelled selector that keep
// does not name, and then their Secrets (cert-manager leaves a Secret
// behind its Certificate), and any such Secret the operator's own CA
// wrote before.
func (c *CertManager) pruneLeaves(ctx context.Context, owner client.Object, selector map[string]string, keep map[string]bool) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(certificateGVK.GroupVersion().WithKind(certificateGVK.Kind + "List"))
	if err := c.cached().List(ctx, list, client.InNamespace(owner.GetNamespace()), client.MatchingLabels(selector)); err != nil {
		return fmt.Errorf("failed to list %s's Certificates: %w", owner.GetName(), err)
	}
	for i := range list.Items {
		crt := &list.Items[i]
		if keep[crt.GetName()] || !metav1.IsControlledBy(crt, owner) {
			continue
		}
		if err := c.Client.Delete(ctx, crt); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("failed to delete Certificate %s: %w", crt.GetName(), err)
		}
		log.FromContext(ctx).Info("Deleted a Certificate no longer wanted", "certificate", crt.GetName())
	}
	return pruneSecrets(ctx, c.Client, owner, selector, keep)
}

// applyCertificate creates want (controlled by owner; nil: the operator's
// own, recognised by its labels) or updates the Certificate of its name
// to ask for what want asks. One the operator does not own is an error:
// it is never overwritten.
func (c *CertManager) applyCertificate(ctx context.Context, reader client.Reader, owner client.Object, want *unstructured.Unstructured) error {
	have := newCertificate()
	err := reader.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case apierrors.IsNotFound(err):
		if owner != nil {
			if err := controllerutil.SetControllerReference(owner, want, c.Scheme); err != nil {
				return fmt.Errorf("failed to set the owner of Certificate %s: %w", want.GetName(), err)
			}
		}
		if err := c.Client.Create(ctx, want); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Created a moment ago, and not in the cache yet: its
				// arrival there reconciles the owner again.
				return nil
			}
			return fmt.Errorf("failed to create Certificate %s: %w", want.GetName(), err)
		}
		log.FromContext(ctx).Info("Asked cert-manager for a certificate", "certificate", want.GetName(), "issuer", c.Issuer.Kind+"/"+c.Issuer.Name)
		return nil
	case err != nil:
		return fmt.Errorf("failed to read Certificate %s: %w", want.GetName(), err)
	case owner != nil && !metav1.IsControlledBy(have, owner), owner == nil && !hasLabels(have.GetLabels(), CertificateLabels()):
		return fmt.Errorf("certificate %s exists and is not the operator's: the operator will not overwrite it; delete or rename it", want.GetName())
	}
	if containsAll(have.Object["spec"], want.Object["spec"]) && hasLabels(have.GetLabels(), want.GetLabels()) {
		return nil
	}
	have.Object["spec"] = want.Object["spec"]
	labels := have.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, want.GetLabels())
	have.SetLabels(labels)
	if err := c.Client.Update(ctx, have); err != nil {
		return fmt.Errorf("failed to update Certificate %s: %w", want.GetName(), err)
	}
	log.FromContext(ctx).Info("Updated what a certificate must name", "certificate", want.GetName())
	return nil
}

// newCertificate is an empty cert-manager Certificate.
func newCertificate() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(certificateGVK)
	return u
}

// Key usages of every certificate: each serves and is a client.
var certificateUsages = []any{"digital signature", "server auth", "client auth"}

// desiredCertificate is the Certificate asking issuer for l's certificate
// in the Secret key.Name, with labels on both: an ECDSA P-256 key, new at
// each renewal, renewed at two thirds of lifetime.
func desiredCertificate(key types.NamespacedName, l pki.Leaf, issuer IssuerRef, lifetime time.Duration, labels map[string]string) *unstructured.Unstructured {
	spec := map[string]any{
		"secretName":            key.Name,
		"issuerRef":             map[string]any{"name": issuer.Name, "kind": issuer.Kind, "group": issuer.Group},
		"duration":              lifetime.String(),
		"renewBeforePercentage": int64(33),
		"uris":                  []any{l.Identity},
		"privateKey":            map[string]any{"algorithm": "ECDSA", "size": int64(256), "rotationPolicy": "Always"},
		"usages":                certificateUsages,
		"secretTemplate":        map[string]any{"labels": stringMap(labels)},
	}
	if len(l.DNSNames) > 0 {
		spec["dnsNames"] = anySlice(l.DNSNames)
	}
	if len(l.IPs) > 0 {
		ips := make([]string, len(l.IPs))
		for i, ip := range l.IPs {
			ips[i] = ip.String()
		}
		spec["ipAddresses"] = anySlice(ips)
	}
	u := newCertificate()
	u.SetNamespace(key.Namespace)
	u.SetName(key.Name)
	u.SetLabels(labels)
	u.Object["spec"] = spec
	return u
}

// containsAll says whether have holds everything want holds: maps key by
// key (have may hold more, such as what cert-manager defaults), lists
// element by element.
func containsAll(have, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			if !containsAll(h[k], v) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !containsAll(h[i], w[i]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(have, want)
	}
}

// hasLabels says whether have holds every label of want.
func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func stringMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
