package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
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
			if err := controllers.SetupWithManager(ctx, mgr, controllers.Options{Image: image, ImagePullSecrets: pullSecrets, ReplicaTLS: replicaTLS, FailureTimeout: failureTimeout}); err != nil {
				return err
			}
			if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
				return fmt.Errorf("failed to add the health check: %w", err)
			}
			if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
				return fmt.Errorf("failed to add the readiness check: %w", err)
			}
			logger.Info("Operator starting", "image", image, "metricsAddr", metricsAddr, "leaderElect", leaderElect, "watchNamespaces", watchNamespaces)
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
	cmd.Flags().IntVarP(&verbosity, "verbosity", "v", 0, "log verbosity")
	tlsFlags(cmd, &tlsFiles)
	return cmd
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

// operatorCache is the operator's cache: the replica and worker pods only
// (caching every pod of the cluster would cost memory for nothing), and,
// with namespaces, only those namespaces, so that Roles in them are all
// the operator needs.
func operatorCache(namespaces []string) (cache.Options, error) {
	opts := cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: controllers.OperatorPodSelector()},
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
