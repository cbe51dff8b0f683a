package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/internal/pki"
	"github.com/catena-streams/catena/rpc/transport"
)

// operatorLeaderElectionID names the Lease that operator replicas contend
// for when leader election is on.
const operatorLeaderElectionID = "catena-operator.streams.catena.io"

func newOperatorCommand() *cobra.Command {
	var (
		metricsAddr, probeAddr, image string
		pullSecrets, watchNamespaces  []string
		leaderElect                   bool
		verbosity                     int
		failureTimeout                time.Duration
		lease                         leaseTimings
		tlsFiles                      transport.TLSFiles
		netpol                        networkPolicyFlags
		certs                         certificateFlags
		nodeLoss                      nodeLossFlags
	)
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "Run the Kubernetes operator for ReplicaPools, Streams and Aggregations",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := newLogger(verbosity)
			ctrl.SetLogger(logger)
			ctx, cancel := signalContext()
			defer cancel()

			scheme := runtime.NewScheme()
			if err := clientgoscheme.AddToScheme(scheme); err != nil {
				return fmt.Errorf("failed to register client-go kinds: %w", err)
			}
			if err := streamsv1alpha1.AddToScheme(scheme); err != nil {
				return fmt.Errorf("failed to register streams.catena.io kinds: %w", err)
			}
			replicaTLS, err := tlsFiles.Config()
			if err != nil {
				return err
			}
			if err := lease.validate(); leaderElect && err != nil {
				return err
			}
			cacheOpts, err := operatorCache(watchNamespaces)
			if err != nil {
				return err
			}
			netpolOpts, err := netpol.options(os.Getenv("POD_NAMESPACE"))
			if err != nil {
				return err
			}
			certificates, err := certs.certificates(cmp.Or(netpol.namespace, os.Getenv("POD_NAMESPACE")), tlsFiles.Enabled())
			if err != nil {
				return err
			}
			cfg, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("failed to find a kubeconfig: %w", err)
			}
			mgr, err := ctrl.NewManager(cfg, ctrl.Options{
				Scheme:                 scheme,
				Metrics:                metricsserver.Options{BindAddress: metricsAddr},
				HealthProbeBindAddress: probeAddr,
				LeaderElection:         leaderElect,
				LeaderElectionID:       operatorLeaderElectionID,
				// Stop reconciling as soon as leadership is lost, and let a
				// new leader take over without waiting for the lease.
				LeaderElectionReleaseOnCancel: true,
				LeaseDuration:                 &lease.duration,
				RenewDeadline:                 &lease.renewDeadline,
				RetryPeriod:                   &lease.retryPeriod,
				Cache:                         cacheOpts,
			})
			if err != nil {
				return fmt.Errorf("failed to create the controller manager: %w", err)
			}
			nodeLossOpts, err := nodeLoss.options(watchNamespaces)
			if err != nil {
				return err
			}
			if nodeLossOpts == nil {
				logger.Info("Replicas lost with their node are not replaced", "why", nodeLoss.offReason(watchNamespaces))
			}
			if err := controllers.SetupWithManager(ctx, mgr, controllers.Options{Image: image, ImagePullSecrets: pullSecrets, ReplicaTLS: replicaTLS, FailureTimeout: failureTimeout,
				NetworkPolicy: netpolOpts, Certificates: certificates, NodeLoss: nodeLossOpts}); err != nil {
				return err
			}
			if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
				return fmt.Errorf("failed to add the health check: %w", err)
			}
			if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
				return fmt.Errorf("failed to add the readiness check: %w", err)
			}
			logger.Info("Operator starting", "image", image, "metricsAddr", metricsAddr, "leaderElect", leaderElect, "watchNamespaces", watchNamespaces, "certificates", certs.mode)
			if err := mgr.Start(ctx); err != nil {
				return fmt.Errorf("operator stopped: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address to serve Prometheus /metrics on (0: off)")
	cmd.Flags().StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address to serve /healthz and /readyz on")
	cmd.Flags().BoolVar(&leaderElect, "leader-elect", false, "elect a leader among operator replicas, so that only one reconciles")
	cmd.Flags().DurationVar(&lease.duration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits after the leader last renewed its Lease before taking over")
	cmd.Flags().DurationVar(&lease.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader tries to renew its Lease before it stops reconciling")
	cmd.Flags().DurationVar(&lease.retryPeriod, "leader-elect-retry-period", 2*time.Second, "how often operator replicas try to acquire or renew the Lease")
	cmd.Flags().StringVar(&image, "image", "catena:dev", "container image of the pods the operator runs: replicas, ingestion and aggregator workers")
	cmd.Flags().StringSliceVar(&watchNamespaces, "watch-namespaces", nil, "namespaces (comma-separated) to run Streams, pools and Aggregations in; empty: every namespace. With a list, Roles in those namespaces are all the operator needs (the chart's watchNamespaces)")
	cmd.Flags().StringSliceVar(&pullSecrets, "image-pull-secrets", nil, "Secrets (names, comma-separated, in each operand's namespace) to pull that image with, on every pod the operator runs")
	cmd.Flags().DurationVar(&failureTimeout, "failure-timeout", controllers.DefaultFailureTimeout, "how long a replica may stay silent, or its pod not Ready, before its chains are reordered without it")
	cmd.Flags().BoolVar(&nodeLoss.enabled, "replace-lost-replicas", true, "give a replica whose local volume is on a lost node (deleted, or NotReady for --node-loss-grace) a new volume on another node, one member of a chain at a time (off with --watch-namespaces: it reads Nodes and PersistentVolumes)")
	cmd.Flags().DurationVar(&nodeLoss.grace, "node-loss-grace", controllers.DefaultNodeLossGrace, "how long a node may be NotReady before its replicas are lost with it (a deleted Node is lost at once)")
	cmd.Flags().IntVarP(&verbosity, "verbosity", "v", 0, "log verbosity")
	cmd.Flags().BoolVar(&netpol.enabled, "network-policies", false, "give each ReplicaPool a NetworkPolicy: its replica port reachable only from its pods, ingestion and this operator (needs a CNI that enforces them)")
	cmd.Flags().StringVar(&netpol.namespace, "operator-namespace", "", "the operator's namespace, where its CA Secret lives and which --network-policies admits (default: $POD_NAMESPACE)")
	cmd.Flags().StringVar(&certs.mode, "certificates", certificatesOperator, "who issues the operands' certificates: operator (the operator's own CA, kept in --ca-secret), cert-manager (Certificates signed by --issuer-name), both with mutual TLS among operands and per-Stream access; or none (plaintext operands, for development)")
	cmd.Flags().StringVar(&certs.secret, "ca-secret", controllers.DefaultCASecret, "the Secret, in the operator's namespace, holding the operator's CA (created when missing); with any issuer, <ca-secret>-bundle is the ConfigMap publishing the trust bundle")
	cmd.Flags().StringVar(&certs.issuer.Name, "issuer-name", "", "with --certificates=cert-manager: the issuer that signs every certificate (it must return its CA in ca.crt: a CA or Vault issuer)")
	cmd.Flags().StringVar(&certs.issuer.Kind, "issuer-kind", "ClusterIssuer", "with --certificates=cert-manager: ClusterIssuer, or Issuer (then one of that name in the operator's namespace and each namespace it runs pods in, all under one root CA)")
	cmd.Flags().StringVar(&certs.issuer.Group, "issuer-group", "cert-manager.io", "with --certificates=cert-manager: the issuer's API group (another for an external issuer)")
	cmd.Flags().DurationVar(&certs.leafLifetime, "certificate-lifetime", pki.DefaultLeafLifetime, "lifetime of the certificates the operator issues; each is renewed at two thirds of it")
	cmd.Flags().DurationVar(&certs.caLifetime, "ca-lifetime", pki.DefaultCALifetime, "lifetime of the operator's CA; the next CA is made at two thirds of it")
	cmd.Flags().DurationVar(&certs.propagation, "ca-propagation", pki.DefaultPropagation, "how long a new CA is trusted everywhere before it signs")
	cmd.Flags().BoolVar(&certs.metricsTLS, "metrics-tls", false, "with --certificates=operator or cert-manager: every pod it runs serves metrics over HTTPS (verify with the ConfigMap <ca-secret>-bundle and the server name "+transport.MetricsServerName+")")
	cmd.Flags().StringToStringVar(&netpol.podLabels, "operator-pod-labels", map[string]string{"app.kubernetes.io/name": "catena", "app.kubernetes.io/component": "operator"},
		"labels of the operator's pods, for --network-policies")
	tlsFlags(cmd, &tlsFiles)
	return cmd
}

// Values of --certificates.
const (
	certificatesOperator    = "operator"
	certificatesCertManager = "cert-manager"
	certificatesNone        = "none"
)

// certificateFlags are the operator's flags for its own CA.
type certificateFlags struct {
	mode, secret                          string
	issuer                                controllers.IssuerRef
	leafLifetime, caLifetime, propagation time.Duration
	metricsTLS                            bool
}

// certificates is the issuer the flags give (nil with none). namespace is
// the operator's.
func (f certificateFlags) certificates(namespace string, ownFiles bool) (controllers.CertificateIssuer, error) {
	switch f.mode {
	case certificatesNone:
		if f.metricsTLS {
			return nil, errors.New("--metrics-tls needs --certificates=operator or cert-manager: the pods' metrics are served with the certificates it issues")
		}
		return nil, nil
	case certificatesOperator, certificatesCertManager:
	default:
		return nil, fmt.Errorf("--certificates must be %s, %s or %s, got %q", certificatesOperator, certificatesCertManager, certificatesNone, f.mode)
	}
	switch {
	case ownFiles:
		return nil, fmt.Errorf("--tls-cert, --tls-key and --tls-ca are for --certificates=none (with %s, the operator's certificate comes from its issuer)", f.mode)
	case namespace == "":
		return nil, fmt.Errorf("--certificates=%s needs the operator's namespace, for its own certificate and the trust bundle: --operator-namespace, or POD_NAMESPACE from the downward API", f.mode)
	case f.leafLifetime < time.Hour:
		return nil, fmt.Errorf("--certificate-lifetime must be at least 1h, got %v", f.leafLifetime)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return nil, fmt.Errorf("the operator's namespace %q is not a namespace name: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(f.secret); len(errs) > 0 {
		return nil, fmt.Errorf("--ca-secret %q is not a Secret name: %s", f.secret, strings.Join(errs, "; "))
	}
	if f.mode == certificatesCertManager {
		switch {
		case f.issuer.Name == "":
			return nil, errors.New("--certificates=cert-manager needs --issuer-name: the Issuer or ClusterIssuer that signs every certificate")
		case f.issuer.Kind != "Issuer" && f.issuer.Kind != "ClusterIssuer" && f.issuer.Group == "cert-manager.io":
			return nil, fmt.Errorf("--issuer-kind must be Issuer or ClusterIssuer for group cert-manager.io, got %q", f.issuer.Kind)
		case f.issuer.Kind == "" || f.issuer.Group == "":
			return nil, errors.New("--issuer-kind and --issuer-group must not be empty")
		}
		return &controllers.CertManager{Namespace: namespace, Issuer: f.issuer, OperatorCertificate: controllers.DefaultOperatorCertificate,
			BundleConfigMap: f.secret + "-bundle", LeafLifetime: f.leafLifetime, MetricsTLS: f.metricsTLS}, nil
	}
	switch {
	case f.caLifetime < 3*f.leafLifetime:
		return nil, fmt.Errorf("--ca-lifetime (%v) must be at least three times --certificate-lifetime (%v): a certificate must not outlive the CA that signed it", f.caLifetime, f.leafLifetime)
	case f.propagation < 0:
		return nil, fmt.Errorf("--ca-propagation must not be negative, got %v", f.propagation)
	}
	return &controllers.Certificates{Namespace: namespace, SecretName: f.secret, LeafLifetime: f.leafLifetime,
		Rotation: pki.Rotation{Lifetime: f.caLifetime, Propagation: f.propagation}, MetricsTLS: f.metricsTLS}, nil
}

// networkPolicyFlags are the operator's flags for NetworkPolicies.
type networkPolicyFlags struct {
	enabled   bool
	namespace string
	podLabels map[string]string
}

// options are the NetworkPolicy options the flags give (nil: off). The
// operator's namespace is --operator-namespace, else podNamespace (the
// downward API's POD_NAMESPACE).
func (f networkPolicyFlags) options(podNamespace string) (*controllers.NetworkPolicyOptions, error) {
	if !f.enabled {
		return nil, nil
	}
	ns := cmp.Or(f.namespace, podNamespace)
	if ns == "" {
		return nil, errors.New("--network-policies needs the operator's namespace: --operator-namespace, or POD_NAMESPACE from the downward API")
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return nil, fmt.Errorf("--operator-namespace: %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
	}
	if len(f.podLabels) == 0 {
		return nil, errors.New("--network-policies needs --operator-pod-labels: without them every pod of the operator's namespace could reach the replicas' admin port")
	}
	if err := metav1validation.ValidateLabels(f.podLabels, field.NewPath("--operator-pod-labels")).ToAggregate(); err != nil {
		return nil, err
	}
	return &controllers.NetworkPolicyOptions{OperatorNamespace: ns, OperatorPodLabels: f.podLabels}, nil
}

// leaseTimings are the leader election's timings.
type leaseTimings struct {
	duration, renewDeadline, retryPeriod time.Duration
}

// validate refuses timings under which two operators could both think they
// lead: the leader must give up (renewDeadline) before a standby may take
// over (duration), and retry more than once within its deadline.
func (l leaseTimings) validate() error {
	switch {
	case l.retryPeriod <= 0:
		return fmt.Errorf("--leader-elect-retry-period must be positive, got %v", l.retryPeriod)
	case l.renewDeadline <= l.retryPeriod:
		return fmt.Errorf("--leader-elect-renew-deadline (%v) must be longer than --leader-elect-retry-period (%v)", l.renewDeadline, l.retryPeriod)
	case l.duration <= l.renewDeadline:
		return fmt.Errorf("--leader-elect-lease-duration (%v) must be longer than --leader-elect-renew-deadline (%v)", l.duration, l.renewDeadline)
	}
	return nil
}

// nodeLossFlags are --replace-lost-replicas and --node-loss-grace.
type nodeLossFlags struct {
	enabled bool
	grace   time.Duration
}

// options are the controllers' NodeLoss options: nil when replacement is
// off, or in namespaced mode, whose Roles cannot read Nodes and
// PersistentVolumes (cluster-scoped).
func (f nodeLossFlags) options(watchNamespaces []string) (*controllers.NodeLossOptions, error) {
	if f.grace <= 0 {
		return nil, fmt.Errorf("--node-loss-grace must be positive, not %v (--replace-lost-replicas=false turns replacement off)", f.grace)
	}
	if !f.enabled || len(watchNamespaces) > 0 {
		return nil, nil
	}
	return &controllers.NodeLossOptions{Grace: f.grace}, nil
}

func (f nodeLossFlags) offReason(watchNamespaces []string) string {
	if !f.enabled {
		return "--replace-lost-replicas=false"
	}
	return "namespaced mode (--watch-namespaces): reading Nodes and PersistentVolumes needs a ClusterRole"
}

// operatorCache is the operator's cache: the replica and worker pods only
// (caching every pod of the cluster would cost memory for nothing), and,
// with namespaces, only those namespaces, so that Roles in them are all
// the operator needs.
func operatorCache(namespaces []string) (cache.Options, error) {
	opts := cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: controllers.OperatorPodSelector()},
		// Only the Secrets the operator issues: never the cluster's.
		&corev1.Secret{}: {Label: labels.SelectorFromSet(controllers.CertificateLabels())},
	}}
	if len(namespaces) == 0 {
		return opts, nil
	}
	opts.DefaultNamespaces = map[string]cache.Config{}
	for _, ns := range namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return cache.Options{}, fmt.Errorf("--watch-namespaces: %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	return opts, nil
}
