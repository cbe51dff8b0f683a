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
	aggReassignments = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "catena_operator_aggregation_reassignments_total",
		Help: "Aggregation shards given to a worker under a new assignment generation, by reason (Assigned, WorkerFailed, WorkerStalled, Rebalanced).",
	}, []string{"reason"})
	aggRestorations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "catena_operator_aggregation_restorations_total",
		Help: "Aggregation shards restored and running on a new owner after a move, by reason (WorkerFailed, WorkerStalled, Rebalanced).",
	}, []string{"reason"})
	aggAssignErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "catena_operator_aggregation_assign_errors_total",
		Help: "Assign calls to aggregator workers that failed and are retried, by namespace.",
	}, []string{"namespace"})
)

func init() {
	metrics.Registry.MustRegister(chainReconfigurations, chainRPCErrors, aggReassignments, aggRestorations, aggAssignErrors)
}
