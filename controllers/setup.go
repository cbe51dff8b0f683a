package controllers

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/catena-streams/catena/rpc/transport"
)

// Options configure the operator's reconcilers.
type Options struct {
	// Image is the container image of the pods the operator runs:
	// replicas, ingestion and aggregator workers.
	Image string
	// ImagePullSecrets name Secrets (in each operand's namespace) added to
	// every pod the operator runs, before the object's own
	// spec.pod.imagePullSecrets.
	ImagePullSecrets []string
	// ReplicaAddr says where replica pods are reached (nil: PodDNSAddr,
	// through the pool's headless Service). Tests point it at replica
	// processes on loopback.
	ReplicaAddr ReplicaAddrFunc
	// ReplicaTLS is the client TLS config for the replica admin API (nil:
	// plaintext).
	ReplicaTLS *tls.Config
	// FailureTimeout: see DefaultFailureTimeout (0: that).
	FailureTimeout time.Duration
	// WorkerAddr says where aggregator worker pods are reached (nil:
	// WorkerDNSAddr, through the workers' headless Service). Tests point
	// it at aggregator processes on loopback.
	WorkerAddr WorkerAddrFunc
	// NetworkPolicy turns on a NetworkPolicy per ReplicaPool (nil: none).
	NetworkPolicy *NetworkPolicyOptions
	// Certificates, when set, issues every operand's certificate (the
	// operator's own CA, or a cert-manager issuer): the operands run with
	// mutual TLS and --allow-*, and the operator's links use its own
	// certificate from it (ReplicaTLS is then ignored). Nil: plaintext
	// operands.
	Certificates CertificateIssuer
	// NodeLoss, when set, replaces replicas lost with their node (nil:
	// never).
	NodeLoss *NodeLossOptions
	// AggregationIngestAddr says which ingestion address workers are told
	// to read sources and write checkpoints through (nil: the source
	// Stream's status.endpoints.producers). Tests point it at an ingestion
	// process on loopback.
	AggregationIngestAddr IngestAddrFunc
}

// SetupWithManager registers every reconciler of the operator with mgr,
// whose scheme must hold client-go's kinds and api/v1alpha1's.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if opts.Image == "" {
		return fmt.Errorf("failed to set up the operator: the replica image is empty")
	}
	if c := opts.Certificates; c != nil {
		if err := c.bind(mgr); err != nil {
			return err
		}
		if err := mgr.Add(c); err != nil {
			return fmt.Errorf("failed to register the operator's CA: %w", err)
		}
		opts.ReplicaTLS = c.ClientTLS()
	}
	recorder := mgr.GetEventRecorder("catena-operator")
	pools := &ReplicaPoolReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Image: opts.Image, ImagePullSecrets: opts.ImagePullSecrets,
		NetworkPolicy: opts.NetworkPolicy, Certificates: opts.Certificates, NodeLoss: opts.NodeLoss, APIReader: mgr.GetAPIReader(), Recorder: recorder}
	if err := pools.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("failed to set up the ReplicaPool controller: %w", err)
	}
	addr := opts.ReplicaAddr
	if addr == nil {
		addr = PodDNSAddr
	}
	conns := transport.NewPool(opts.ReplicaTLS)
	ledgers := &chainLedgers{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()}
	gates := &ChainsReadyReconciler{Client: mgr.GetClient(), Conns: conns, ReplicaAddr: addr, ledgers: ledgers}
	if err := gates.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("failed to set up the chains-ready gate controller: %w", err)
	}
	streams := &StreamReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Image: opts.Image, ImagePullSecrets: opts.ImagePullSecrets,
		Recorder: recorder, Conns: conns, ReplicaAddr: addr, Certificates: opts.Certificates}
	if err := streams.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("failed to set up the Stream controller: %w", err)
	}
	chains := &ChainReconciler{
		Client: mgr.GetClient(), Recorder: recorder,
		Conns: conns, ReplicaAddr: addr, FailureTimeout: opts.FailureTimeout,
		ledgers: ledgers,
	}
	if err := chains.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("failed to set up the ReplicationChain controller: %w", err)
	}
	aggs := &AggregationReconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Image: opts.Image, ImagePullSecrets: opts.ImagePullSecrets, Recorder: recorder,
		Conns: conns, ReplicaAddr: addr, WorkerAddr: opts.WorkerAddr, IngestAddr: opts.AggregationIngestAddr,
		Certificates: opts.Certificates,
	}
	if err := aggs.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("failed to set up the Aggregation controller: %w", err)
	}
	// Connections to replicas and workers close with the manager.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		conns.Close()
		return nil
	})); err != nil {
		return fmt.Errorf("failed to register the replica connection pool: %w", err)
	}
	return nil
}
