package controllers

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Options configure the operator's reconcilers.
type Options struct {
	// Image is the container image of replica pods.
	Image string
}

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// SetupWithManager registers every reconciler of the operator with mgr,
// whose scheme must hold client-go's kinds and api/v1alpha1's.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if opts.Image == "" {
		return fmt.Errorf("failed to set up the operator: the replica image is empty")
	}
	pools := &ReplicaPoolReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Image: opts.Image}
	if err := pools.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("failed to set up the ReplicaPool controller: %w", err)
	}
	streams := &StreamReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme()}
	if err := streams.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("failed to set up the Stream controller: %w", err)
	}
	return nil
}
