package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/probe"
	"github.com/catena-streams/catena/rpc/transport"
)

// Timing of the workers' observation.
const (
	// workerObserveInterval is how often the observer looks for
	// Aggregations to wake and workers to probe.
	workerObserveInterval = 100 * time.Millisecond
	// minWorkerProbeInterval and maxWorkerProbeInterval bound how often a
	// worker is asked for its Status: an eighth of the Aggregation's
	// failure timeout, so that a silent worker is noticed in time.
	minWorkerProbeInterval = 100 * time.Millisecond
	maxWorkerProbeInterval = 500 * time.Millisecond
)

// workerProbeInterval is how often the workers of an Aggregation of
// failure timeout timeout are asked for their Status.
func workerProbeInterval(timeout time.Duration) time.Duration {
	return min(max(timeout/8, minWorkerProbeInterval), maxWorkerProbeInterval)
}

// workerFresh is how long a worker's answer counts as its current one.
func workerFresh(interval time.Duration) time.Duration {
	return 2*interval + 100*time.Millisecond
}

// workerObservers probe the workers of every Aggregation outside the
// reconciles, as the pool observers probe replicas: each worker on its own
// cadence and deadline (rpc/probe), so that a worker that hangs holds up
// nothing, and the Aggregation's reconcile decides from the latest answers.
// A manager Runnable keeps each Aggregation's set of workers current (its
// pods) and wakes the Aggregation when what its workers report changes in
// a way the reconcile decides from: a worker answering or not, its
// assignment generation, a shard's phase, restoration or error; not the
// offsets, which the reconcile's periodic rounds record.
type workerObservers struct {
	Client     client.Client
	Conns      *transport.Pool
	WorkerAddr WorkerAddrFunc
	// Wake receives an Aggregation whose workers' view changed.
	Wake chan event.GenericEvent
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	mu     sync.Mutex
	aggs   map[types.NamespacedName]*observedWorkers
	closed bool
}

// observedWorkers are one Aggregation's worker probes and the view it was
// last woken for.
type observedWorkers struct {
	probes *probe.Set[*catenapb.AggregatorStatus]
	digest string
}

func newWorkerObservers(c client.Client, conns *transport.Pool, addr WorkerAddrFunc, now func() time.Time) *workerObservers {
	return &workerObservers{
		Client: c, Conns: conns, WorkerAddr: addr, Now: now,
		Wake: make(chan event.GenericEvent, 256), aggs: map[types.NamespacedName]*observedWorkers{},
	}
}

// askWorker is one Status probe of a worker of the Aggregation named name
// (namespace/name): a worker serving another Aggregation does not answer
// for this one.
func askWorker(name string) probe.Ask[*catenapb.AggregatorStatus] {
	return func(ctx context.Context, conn *grpc.ClientConn, id string) (*catenapb.AggregatorStatus, error) {
		st, err := catenapb.NewAggregatorClient(conn).Status(ctx, &catenapb.AggregatorStatusRequest{})
		if err != nil {
			return nil, err
		}
		if a := st.GetAggregation(); a != "" && a != name {
			return nil, status.Errorf(codes.FailedPrecondition, "%s serves Aggregation %s", id, a)
		}
		return st, nil
	}
}

// workers returns the Aggregation's probes, started on demand, probing at
// least addrs at the probe interval of timeout (an Aggregation's
// failureTimeout may change: the interval follows it).
func (w *workerObservers) workers(agg types.NamespacedName, timeout time.Duration, addrs map[string]string) *observedWorkers {
	interval := workerProbeInterval(timeout)
	w.mu.Lock()
	ow := w.aggs[agg]
	if ow == nil {
		ow = &observedWorkers{
			probes: probe.NewSet(w.Conns, askWorker(agg.Namespace+"/"+agg.Name), probe.Options{
				Interval: interval, CallTimeout: statusProbeTimeout, Now: w.Now,
			}),
		}
		if w.closed {
			// A reconcile finishing after shutdown sees workers never
			// probed.
			ow.probes.Stop()
			w.mu.Unlock()
			return ow
		}
		w.aggs[agg] = ow
	}
	w.mu.Unlock()
	ow.probes.SetInterval(interval)
	ow.probes.AddTargets(addrs)
	return ow
}

// forget stops probing an Aggregation's workers (it is gone or being
// deleted).
func (w *workerObservers) forget(agg types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ow := w.aggs[agg]; ow != nil {
		ow.probes.Stop()
		delete(w.aggs, agg)
	}
}

// workerView is what a reconcile reads of its workers.
type workerView struct {
	// Complete: every worker has been probed since it was added.
	Complete bool
	// Reports are the fresh answers, by worker.
	Reports map[string]*catenapb.AggregatorStatus
	// LastAnswer is when each worker's latest answer was asked for;
	// FirstAsked when it was first probed at its address.
	LastAnswer, FirstAsked map[string]time.Time
}

// view reads the probes' latest outcomes at now.
func (ow *observedWorkers) view(now time.Time) workerView {
	v := workerView{Complete: !ow.probes.Stopped(), Reports: map[string]*catenapb.AggregatorStatus{},
		LastAnswer: map[string]time.Time{}, FirstAsked: map[string]time.Time{}}
	fresh := workerFresh(ow.probes.Interval())
	for id, r := range ow.probes.Results() {
		v.FirstAsked[id] = r.Added
		if !r.Probed() {
			v.Complete = false
		}
		if r.Answered {
			v.LastAnswer[id] = r.AskedOK
		}
		if r.Fresh(now, fresh) {
			v.Reports[id] = r.Resp
		}
	}
	return v
}

// Start runs the loop until ctx ends, then stops every probe.
func (w *workerObservers) Start(ctx context.Context) error {
	t := time.NewTicker(workerObserveInterval)
	defer t.Stop()
	defer func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.closed = true
		for k, ow := range w.aggs {
			ow.probes.Stop()
			delete(w.aggs, k)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := w.round(ctx); err != nil {
			log.FromContext(ctx).Error(err, "Observing the Aggregations' workers failed; trying again")
		}
	}
}

func (w *workerObservers) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

// round updates every Aggregation's set of workers to its pods and wakes
// the Aggregations whose view changed.
func (w *workerObservers) round(ctx context.Context) error {
	var aggs streamsv1alpha1.AggregationList
	if err := w.Client.List(ctx, &aggs, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("failed to list Aggregations: %w", err)
	}
	seen := map[types.NamespacedName]bool{}
	for i := range aggs.Items {
		agg := &aggs.Items[i]
		if !agg.DeletionTimestamp.IsZero() {
			continue
		}
		key := client.ObjectKeyFromObject(agg)
		seen[key] = true
		addrs, err := w.workerAddrs(ctx, agg)
		if err != nil {
			return err
		}
		ow := w.workers(key, agg.Spec.FailureTimeout.Duration, addrs)
		ow.probes.SetTargets(addrs)
		v := ow.view(w.now())
		if !v.Complete {
			continue
		}
		d := workersDigest(v)
		if d == ow.digest {
			continue
		}
		ow.digest = d
		wake := &streamsv1alpha1.Aggregation{}
		wake.Namespace, wake.Name = agg.Namespace, agg.Name
		select {
		case w.Wake <- event.GenericEvent{Object: wake}:
		case <-ctx.Done():
			return nil
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for key, ow := range w.aggs {
		if !seen[key] {
			ow.probes.Stop()
			delete(w.aggs, key)
		}
	}
	return nil
}

// workerAddrs are the addresses of an Aggregation's worker pods that may
// run: not terminal, not being deleted.
func (w *workerObservers) workerAddrs(ctx context.Context, agg *streamsv1alpha1.Aggregation) (map[string]string, error) {
	var pods corev1.PodList
	if err := w.Client.List(ctx, &pods, client.InNamespace(agg.Namespace), client.MatchingLabels(aggSelectorLabels(agg)), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("failed to list the worker pods of Aggregation %s/%s: %w", agg.Namespace, agg.Name, err)
	}
	addrOf := w.WorkerAddr
	if addrOf == nil {
		addrOf = WorkerDNSAddr
	}
	return runnableWorkerAddrs(pods.Items, addrOf), nil
}

// runnableWorkerAddrs are the addresses of the pods that may run: not
// terminal, not being deleted.
func runnableWorkerAddrs(pods []corev1.Pod, addrOf WorkerAddrFunc) map[string]string {
	addrs := map[string]string{}
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			addrs[p.Name] = addrOf(p)
		}
	}
	return addrs
}

// workersDigest sums up what an Aggregation's reconcile decides from, of
// its workers' answers, except offsets: which workers answer, each one's
// generation, and each shard's phase, restoration and error. A change
// wakes the reconcile; offsets alone do not, or every record folded would
// wake it.
func workersDigest(v workerView) string {
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(v.Reports)) {
		st := v.Reports[id]
		fmt.Fprintf(&b, "%s g%d:", id, st.GetGeneration())
		for _, sh := range st.GetShards() {
			fmt.Fprintf(&b, " %d/%d/%d/%q", sh.GetShard(), sh.GetPhase(), sh.GetRestoration().GetStartedMs(), sh.GetError())
		}
		b.WriteString(";")
	}
	return b.String()
}
