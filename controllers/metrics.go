package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The operator's own metrics, served with controller-runtime's (reconcile
// counts, durations, work queues) on the manager's metrics endpoint.
var (
	chainReconfigurations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "catena_operator_chain_reconfigurations_total",
		Help: "Chain memberships the operator wrote under a new epoch, by reason (Created, HeadFailed, MiddleFailed, TailFailed, MemberReturned, MemberReplaced, Rebalanced).",
	}, []string{"reason"})
	chainRPCErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "catena_operator_chain_step_errors_total",
		Help: "Chain steps (Configure, EpochEnd, Truncate calls to replicas) that failed and are retried, by namespace.",
	}, []string{"namespace"})
)

func init() {
	metrics.Registry.MustRegister(chainReconfigurations, chainRPCErrors)
}
