package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/catena-streams/catena/internal/pki"
	"github.com/catena-streams/catena/rpc/transport"
)

// DefaultCASecret is the name of the Secret, in the operator's namespace,
// that holds the operator's CA.
const DefaultCASecret = "catena-ca"

// componentCertificate labels the Secrets the operator issues. The
// operator's cache holds only Secrets with it.
const componentCertificate = "certificate"

// CertificateLabels are the labels of every Secret the operator issues.
func CertificateLabels() map[string]string {
	return map[string]string{labelName: appName, labelManagedBy: fieldOwner, labelComponent: componentCertificate}
}

// Certificates is the operator's own CA and what it issues: a certificate
// for each pool's replicas, each Stream's ingestion pods and users, and
// each Aggregation's workers, in Secrets their pods mount; and the
// operator's own client certificate, in memory. The CA lives in the Secret
// Namespace/SecretName, created on first start (docs/security.md).
//
// Run it with the manager (Start); the reconcilers call ensureLeaf, which
// waits for the CA's first load.
type Certificates struct {
	// Client writes the Secrets the operator issues; Reader reads the CA
	// Secret, past the cache (the operator's namespace need not be one it
	// watches).
	Client client.Client
	Reader client.Reader
	Scheme *runtime.Scheme
	// Namespace and SecretName locate the CA Secret.
	Namespace, SecretName string
	Rotation              pki.Rotation
	LeafLifetime          time.Duration
	// MetricsTLS runs every pod's metrics over HTTPS (--metrics-tls).
	MetricsTLS bool
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	once   sync.Once
	loaded chan struct{} // closed at the CA's first load

	mu    sync.Mutex
	ca    *pki.CA
	roots *x509.CertPool
	// The operator's own certificate, from issuer, due again at renew.
	own    *tls.Certificate
	issuer *pki.CA
	renew  time.Time
	// followers are woken when the CA or its bundle changes.
	followers bundleFollowers
	// kept remembers, per Secret, the last PlanLeaf that kept it, so that
	// the reconcile loop (a Stream reconciles on every chain change of a
	// failover) parses and verifies a certificate only when the Secret,
	// the CA or what it must name changed, or its renewal is due.
	kept map[types.NamespacedName]keptLeaf
	// trustedSince is when this process first handed out a bundle holding
	// the next CA (zero: none pending): the switch waits the propagation
	// time after it, whatever the CA Secret's clock says.
	trustedSince time.Time
}

func (c *Certificates) init() {
	c.once.Do(func() { c.loaded = make(chan struct{}) })
}

func (c *Certificates) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// podArgs are args, and --metrics-tls when metrics go over TLS.
func (c *Certificates) podArgs(args ...string) []string {
	if c.MetricsTLS {
		return append(args, "--metrics-tls")
	}
	return args
}

// BundleName is the ConfigMap, beside the CA Secret, holding only the CA
// bundle: what a scraper (a PodMonitor's tlsConfig) or a client outside
// the cluster needs to verify Catena's servers.
func (c *Certificates) BundleName() string { return c.SecretName + "-bundle" }

// OperatorIdentity is the identity of the operator's client certificate.
func (c *Certificates) OperatorIdentity() string { return OperatorIdentity(c.Namespace) }

// ClientTLS is the operator's TLS config for its links to replicas and
// aggregation workers: its own certificate, issued in memory from the CA
// and renewed at two thirds of its life, and the CA bundle as it is now.
// Before the CA is loaded, handshakes fail (and are retried).
func (c *Certificates) ClientTLS() *tls.Config {
	return transport.DynamicConfig(c.ownMaterial)
}

func (c *Certificates) ownMaterial() (*tls.Certificate, *x509.CertPool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ca == nil {
		return &tls.Certificate{}, x509.NewCertPool()
	}
	if now := c.now(); c.own == nil || c.issuer != c.ca || !now.Before(c.renew) {
		certPEM, keyPEM, err := c.ca.Issue(pki.Leaf{Identity: c.OperatorIdentity(), Lifetime: c.LeafLifetime}, now)
		if err == nil {
			var pair tls.Certificate
			if pair, err = tls.X509KeyPair(certPEM, keyPEM); err == nil {
				c.own, c.issuer, c.renew = &pair, c.ca, now.Add(c.LeafLifetime*2/3)
			}
		}
		if c.own == nil {
			return &tls.Certificate{}, c.roots
		}
	}
	return c.own, c.roots
}

// bind takes the manager's client, its reader past the cache and scheme.
func (c *Certificates) bind(mgr ctrl.Manager) error {
	c.Client, c.Reader, c.Scheme = mgr.GetClient(), mgr.GetAPIReader(), mgr.GetScheme()
	return nil
}

// NeedLeaderElection: only the leader keeps the CA, as only it reconciles.
func (c *Certificates) NeedLeaderElection() bool { return true }

// Start keeps the CA Secret as pki.PlanCA says until ctx ends: it creates
// the CA, rotates it, and drops expired CAs from the bundle, waking when
// the plan says and at least hourly (to see a CA replaced by hand).
func (c *Certificates) Start(ctx context.Context) error {
	c.init()
	logger := log.FromContext(ctx).WithValues("caSecret", c.Namespace+"/"+c.SecretName)
	for {
		wake, err := c.syncCA(ctx, logger)
		if err != nil {
			logger.Error(err, "Failed to keep the operator's CA; retrying")
			wake = c.now().Add(10 * time.Second)
		}
		if hourly := c.now().Add(time.Hour); wake.After(hourly) {
			wake = hourly
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(wake)):
		}
	}
}

// syncCA reads the CA Secret, writes what the plan says, and loads it.
func (c *Certificates) syncCA(ctx context.Context, logger logr.Logger) (time.Time, error) {
	key := types.NamespacedName{Namespace: c.Namespace, Name: c.SecretName}
	secret := &corev1.Secret{}
	found := true
	if err := c.Reader.Get(ctx, key, secret); err != nil {
		if !apierrors.IsNotFound(err) {
			return time.Time{}, fmt.Errorf("failed to read the CA Secret %s: %w", key, err)
		}
		found = false
	}
	now := c.now()
	c.mu.Lock()
	trusted := c.trustedSince
	c.mu.Unlock()
	data, changed, wake, err := pki.PlanCA(secret.Data, "catena "+c.Namespace, now, trusted, c.Rotation)
	if err != nil {
		return time.Time{}, fmt.Errorf("the CA Secret %s cannot be used (fix or delete it by hand; every certificate the operator issued chains to it): %w", key, err)
	}
	switch {
	case !found:
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.SecretName, Labels: CertificateLabels()},
			Type:       corev1.SecretTypeOpaque,
			Data:       data,
		}
		if err := c.Client.Create(ctx, secret); err != nil {
			// Another operator's write, or a failure: read again.
			return now, fmt.Errorf("failed to create the CA Secret %s: %w", key, err)
		}
		logger.Info("Created the operator's CA")
	case changed:
		secret.Data = data
		if err := c.Client.Update(ctx, secret); err != nil {
			return now, fmt.Errorf("failed to update the CA Secret %s: %w", key, err)
		}
		logger.Info("Rotated the operator's CA", "next", len(data[pki.NextCertKey]) > 0)
	}
	ca, err := pki.ParseCA(data)
	if err != nil {
		return time.Time{}, err
	}
	c.load(ca)
	// load has asked every object to hand out this bundle.
	c.mu.Lock()
	switch next := len(data[pki.NextCertKey]) > 0; {
	case next && c.trustedSince.IsZero():
		c.trustedSince = now
	case !next:
		c.trustedSince = time.Time{}
	}
	c.mu.Unlock()
	// Published after the load: issuing does not wait on it, and a
	// failure is retried by the caller.
	if err := c.publishBundle(ctx, ca.Bundle); err != nil {
		return time.Time{}, err
	}
	return wake, nil
}

// publishBundle keeps the ConfigMap BundleName holding bundle.
func (c *Certificates) publishBundle(ctx context.Context, bundle []byte) error {
	return publishBundleConfigMap(ctx, c.Client, c.Reader, types.NamespacedName{Namespace: c.Namespace, Name: c.BundleName()}, bundle)
}

// load makes ca the one issuing, and tells the reconcilers when it or its
// bundle changed: every leaf must then be signed by it or carry its bundle.
func (c *Certificates) load(ca *pki.CA) {
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ca != nil && c.ca.Cert.Equal(ca.Cert) && string(c.ca.Bundle) == string(ca.Bundle) {
		return
	}
	first := c.ca == nil
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.Bundle)
	c.ca, c.roots = ca, roots
	if first {
		close(c.loaded)
		return
	}
	c.followers.wake()
}

// current returns the CA, waiting for its first load.
func (c *Certificates) current(ctx context.Context) (*pki.CA, error) {
	c.init()
	select {
	case <-c.loaded:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		return nil, errors.New("the operator's CA is not loaded yet (see the operator's log)")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ca, nil
}

// watchCertificates makes a controller (b) whose objects own certificates
// watch them (a Secret deleted by hand is issued again) and the CA: when
// it or its bundle changes, every object all lists (kind, for the log) is
// reconciled, so that each leaf is signed by the new CA or carries its
// bundle.
func (c *Certificates) watchCertificates(b *builder.Builder, kind string, all func(context.Context) ([]reconcile.Request, error)) *builder.Builder {
	return c.followers.follow(b.Owns(&corev1.Secret{}), kind, all)
}

// ensureLeaf keeps the Secret name, controlled by owner, holding a
// certificate for l from the CA as pki.PlanLeaf says, and returns when to
// look again. A Secret of that name the operator does not control is an
// error: it is never overwritten.
func (c *Certificates) ensureLeaf(ctx context.Context, owner client.Object, name string, l pki.Leaf, extraLabels map[string]string) (time.Time, error) {
	ca, err := c.current(ctx)
	if err != nil {
		return time.Time{}, err
	}
	l.Lifetime = c.LeafLifetime
	secret, found, err := readOwnedSecret(ctx, c.Client, owner, name)
	if err != nil {
		return time.Time{}, err
	}
	now := c.now()
	key := types.NamespacedName{Namespace: owner.GetNamespace(), Name: name}
	fingerprint := fmt.Sprint(l.Identity, l.DNSNames, l.IPs)
	if found {
		if wake, ok := c.stillKept(key, secret.ResourceVersion, ca, fingerprint, now); ok {
			return wake, nil
		}
	}
	action, reason, wake := pki.PlanLeaf(secret.Data, l, ca, now)
	var data map[string][]byte
	switch action {
	case pki.LeafKeep:
		c.keep(key, keptLeaf{resourceVersion: secret.ResourceVersion, ca: ca, leaf: fingerprint, wake: wake})
		return wake, nil
	case pki.LeafBundle:
		data = maps.Clone(secret.Data)
		data[pki.BundleKey] = ca.Bundle
	case pki.LeafIssue:
		certPEM, keyPEM, err := ca.Issue(l, now)
		if err != nil {
			return time.Time{}, err
		}
		data = pki.LeafData(certPEM, keyPEM, ca)
		wake = now.Add(c.LeafLifetime * 2 / 3)
	}
	if err := writeOwnedSecret(ctx, c.Client, c.Scheme, owner, secret, found, name, corev1.SecretTypeTLS, data, extraLabels); err != nil {
		return time.Time{}, err
	}
	log.FromContext(ctx).Info("Issued a certificate", "secret", name, "identity", l.Identity, "reason", reason, "bundleOnly", action == pki.LeafBundle)
	return wake, nil
}

// ensureBundle keeps the Secret name, controlled by owner, holding only
// ca.crt, the CA bundle: what a client without a certificate of its own
// needs to verify a server.
func (c *Certificates) ensureBundle(ctx context.Context, owner client.Object, name string) error {
	ca, err := c.current(ctx)
	if err != nil {
		return err
	}
	return ensureBundleSecret(ctx, c.Client, c.Scheme, owner, name, ca.Bundle)
}

// pruneLeaves deletes the Secrets of owner, labelled selector, that keep
// does not name.
func (c *Certificates) pruneLeaves(ctx context.Context, owner client.Object, selector map[string]string, keep map[string]bool) error {
	return pruneSecrets(ctx, c.Client, owner, selector, keep)
}

// keptLeaf is a leaf Secret found good: at resourceVersion, signed by ca,
// for the leaf fingerprinted, until wake.
type keptLeaf struct {
	resourceVersion string
	ca              *pki.CA
	leaf            string
	wake            time.Time
}

// stillKept returns the wake of a Secret found good before and unchanged
// since.
func (c *Certificates) stillKept(key types.NamespacedName, rv string, ca *pki.CA, leaf string, now time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.kept[key]
	if !ok || k.resourceVersion != rv || k.ca != ca || k.leaf != leaf || !now.Before(k.wake) {
		return time.Time{}, false
	}
	return k.wake, true
}

func (c *Certificates) keep(key types.NamespacedName, k keptLeaf) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kept == nil {
		c.kept = map[types.NamespacedName]keptLeaf{}
	}
	c.kept[key] = k
}

// requeueAt merges a wake time into a reconcile result.
func requeueAt(res reconcile.Result, wake time.Time, now time.Time) reconcile.Result {
	if wake.IsZero() {
		return res
	}
	d := max(wake.Sub(now), time.Second)
	if res.RequeueAfter == 0 || d < res.RequeueAfter {
		res.RequeueAfter = d
	}
	return res
}

// requestsFor is a reconcile request for each object.
func requestsFor[T any, P interface {
	*T
	client.Object
}](items []T) []reconcile.Request {
	out := make([]reconcile.Request, 0, len(items))
	for i := range items {
		o := P(&items[i])
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}})
	}
	return out
}
