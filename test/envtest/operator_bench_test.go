package envtest_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/transport"
)

// The operator at scale (make bench-operator): a pool of real replica
// processes, one Stream of many partitions, one replica paused (SIGSTOP:
// a node gone dark) and later one killed; how long until every chain it
// served is reordered without it, and whole again once it is back, and
// what the operator spent on it (times from the fault; the victim is let
// go as soon as every chain is reordered). It prints figures and asserts only that
// every chain recovers; it runs only when CATENA_BENCH_OPERATOR is set.
var _ = Describe("The operator at scale", Ordered, Label("bench"), func() {
	const failureTimeout = 2 * time.Second
	var (
		cases    []benchCase
		replicas *replicaSet
		writes   atomic.Int64 // API requests that change something, by the operator
		wmu      sync.Mutex
		byKind   = map[string]int{} // the same, by verb and resource
	)

	BeforeAll(func() {
		if os.Getenv("CATENA_BENCH_OPERATOR") == "" {
			Skip("set CATENA_BENCH_OPERATOR (make bench-operator) to run the operator benchmark")
		}
		for _, r := range benchInts("CATENA_BENCH_REPLICAS", "3 6") {
			for _, n := range benchInts("CATENA_BENCH_CHAINS", "8 64 256") {
				cases = append(cases, benchCase{replicas: r, chains: n, ns: newNamespace()})
			}
		}
		replicas = newReplicaSet()
		cfg := rest.CopyConfig(testEnv.Config)
		cfg.QPS, cfg.Burst = -1, 0 // as ctrl.GetConfig: the API server's flow control limits, not the client
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.Method != http.MethodGet {
					writes.Add(1)
					wmu.Lock()
					byKind[req.Method+" "+apiResource(req.URL.Path)]++
					wmu.Unlock()
				}
				return rt.RoundTrip(req)
			})
		}
		var nss []string
		for _, c := range cases {
			nss = append(nss, c.ns)
		}
		startManagerWithConfig(cfg, func(ctx context.Context, mgr ctrl.Manager) error {
			return controllers.SetupWithManager(ctx, mgr, controllers.Options{Image: testImage, ReplicaAddr: replicas.addr, FailureTimeout: failureTimeout})
		}, nss...)
	})

	It("reorders every chain of a paused or killed replica, and takes it back", func() {
		var table []string
		for _, bc := range cases {
			pods := make([]string, bc.replicas)
			for i := range pods {
				pods[i] = fmt.Sprintf("big-%d", i)
				replicas.start(bc.ns, pods[i])
			}
			Expect(k8s.Create(ctx, manifest(bc.ns, "ReplicaPool", "big", fmt.Sprintf("replicas: %d", bc.replicas)))).To(Succeed())
			created := time.Now()
			Expect(k8s.Create(ctx, manifest(bc.ns, "Stream", "wide", fmt.Sprintf("pool: big\npartitions: %d\nreplicationFactor: 3", bc.chains)))).To(Succeed())
			Eventually(func(g Gomega) { g.Expect(wholeChains(g, bc.ns)).To(HaveLen(bc.chains)) }).
				WithTimeout(10 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
			GinkgoWriter.Printf("%d replicas, %d chains: placed and installed in %s\n", bc.replicas, bc.chains, time.Since(created).Round(time.Millisecond))

			// The paused replica rejoins at the tail of every chain; the
			// killed one is another, with its share of heads and middles.
			for f, fault := range []string{"pause", "kill"} {
				victim := replicas.get(bc.ns, pods[f])
				var chains streamsv1alpha1.ReplicationChainList
				Expect(k8s.List(ctx, &chains, client.InNamespace(bc.ns))).To(Succeed())
				role := map[string]string{}   // affected chain: the victim's role in it
				partOf := map[string]uint32{} // affected chain: its partition
				for _, c := range chains.Items {
					for i, m := range c.Status.Members {
						if m.Name == victim.id {
							role[c.Name] = memberRole(i, len(c.Status.Members))
							partOf[c.Name] = uint32(*c.Spec.Partition)
						}
					}
				}
				wmu.Lock()
				clear(byKind)
				wmu.Unlock()
				// The test's own observer, as the operator's: when the
				// victim is first judged Failed.
				obs := chainmaster.NewObserver(benchConns, chainmaster.ObserverOptions{FailureTimeout: failureTimeout, Interval: 50 * time.Millisecond})
				addrs := map[string]string{}
				for _, pod := range pods {
					addrs[pod] = replicas.get(bc.ns, pod).addr
				}
				obs.SetReplicas(addrs)
				Eventually(func() bool { return obs.Snapshot().Complete }).Should(BeTrue())
				var detected atomic.Int64
				writesBefore := writes.Load()
				cpuBefore := selfCPU()
				at := time.Now()
				switch fault {
				case "pause":
					victim.pause()
				case "kill":
					victim.kill()
				}
				// And when each affected chain runs without it on its
				// members: writes go on from then, whatever the API says.
				var imu sync.Mutex
				installed := map[string]time.Duration{}
				watchDone := make(chan struct{})
				go func() {
					defer close(watchDone)
					for time.Since(at) < 2*time.Minute {
						snap := obs.Snapshot()
						if detected.Load() == 0 && snap.Health[victim.id] == chainplan.Failed {
							detected.Store(int64(time.Since(at)))
						}
						imu.Lock()
						for name, p := range partOf {
							if _, ok := installed[name]; !ok && installedWithout(snap, "wide", p, victim.id) {
								installed[name] = time.Since(at)
							}
						}
						n := len(installed)
						imu.Unlock()
						if n == len(partOf) && detected.Load() != 0 {
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
				}()
				// Every affected chain: when it first ran without the victim,
				// every remaining member confirming the new epoch.
				reordered := map[string]time.Duration{}
				Eventually(func(g Gomega) {
					var list streamsv1alpha1.ReplicationChainList
					g.Expect(k8s.List(ctx, &list, client.InNamespace(bc.ns))).To(Succeed())
					for i := range list.Items {
						c := &list.Items[i]
						if _, ok := role[c.Name]; !ok || reordered[c.Name] > 0 {
							continue
						}
						if runsWithout(c, victim.id) {
							reordered[c.Name] = time.Since(at)
						}
					}
					g.Expect(len(reordered)).To(Equal(len(role)), "chains reordered without %s", victim.id)
					// Every 250 ms: listing hundreds of chains from the API
					// server takes CPU from the operator and the API server
					// it measures (at 50 ms it was a third of this process's
					// CPU during the failover).
				}).WithTimeout(2 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
				<-watchDone
				writesReorder := writes.Load() - writesBefore
				cpuReorder := selfCPU() - cpuBefore
				obs.Stop()
				wmu.Lock()
				GinkgoWriter.Printf("API writes during the reorder: %v\n", byKind)
				wmu.Unlock()

				switch fault {
				case "pause":
					victim.resume()
				case "kill":
					replicas.start(bc.ns, victim.id)
				}
				// Whole: every chain has its replication factor in chain
				// again, with the victim back (3 replicas) or a spare in its
				// place (6).
				Eventually(func(g Gomega) { g.Expect(wholeChains(g, bc.ns)).To(HaveLen(bc.chains)) }).
					WithTimeout(5 * time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
				whole := time.Since(at)

				all, byRole, confirmed := []time.Duration{}, map[string][]time.Duration{}, []time.Duration{}
				imu.Lock()
				for name, d := range installed {
					all = append(all, d)
					byRole[role[name]] = append(byRole[role[name]], d)
				}
				imu.Unlock()
				for _, d := range reordered {
					confirmed = append(confirmed, d)
				}
				line := fmt.Sprintf("| %d | %d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |", bc.replicas, bc.chains, fault, len(role),
					time.Duration(detected.Load()).Round(10*time.Millisecond), pct(all, 0), pct(all, 0.5), pct(all, 1),
					pct(byRole["head"], 1), pct(byRole["middle"], 1), pct(byRole["tail"], 1), pct(confirmed, 1), whole.Round(10*time.Millisecond),
					writesReorder, cpuReorder.Round(10*time.Millisecond))
				GinkgoWriter.Println(line)
				table = append(table, line)
			}
		}
		out := "| replicas | chains | fault | affected | detected | first | p50 | last | last head | last middle | last tail | last confirmed in the API | all whole again | API writes | test-process CPU |\n" +
			"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n" + strings.Join(table, "\n")
		AddReportEntry("operator at scale", out)
		fmt.Fprintf(GinkgoWriter, "operator at scale (failure timeout %s; times from the fault):\n%s\n", failureTimeout, out)
		fmt.Fprintf(os.Stderr, "\noperator at scale (failure timeout %s; times from the fault):\n%s\n", failureTimeout, out)
	})
})

// benchConns are the test's own connections to the replicas.
var benchConns = transport.NewPool(nil)

// apiResource is the resource (and subresource) of an API path:
// /apis/g/v/namespaces/ns/replicationchains/x/status -> replicationchains/status.
func apiResource(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			rest := parts[i+2:]
			if len(rest) >= 3 {
				return rest[0] + "/" + rest[2]
			}
			return rest[0]
		}
	}
	return path
}

type benchCase struct {
	replicas, chains int
	ns               string
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func benchInts(env, def string) []int {
	v := os.Getenv(env)
	if v == "" {
		v = def
	}
	var out []int
	for _, f := range strings.Fields(v) {
		n, err := strconv.Atoi(f)
		Expect(err).NotTo(HaveOccurred(), "%s=%q", env, v)
		out = append(out, n)
	}
	return out
}

// memberRole names the role of the i-th of n members.
func memberRole(i, n int) string {
	switch {
	case i == 0:
		return "head"
	case i == n-1:
		return "tail"
	default:
		return "middle"
	}
}

// installedWithout: the replicas' latest epoch of the partition leaves id
// out, and every member of it that answers runs that epoch (the chain takes
// writes again).
func installedWithout(snap chainmaster.Snapshot, stream string, p uint32, id string) bool {
	reports := chainmaster.PartitionReports(snap.AnsweredReports(), stream, p)
	latest := chainmaster.LatestReport(reports)
	if latest == nil {
		return false
	}
	for _, m := range latest.GetMembers() {
		if m.GetId() == id {
			return false
		}
		if ps := reports[m.GetId()]; ps == nil || ps.GetEpoch() != latest.GetEpoch() {
			return false
		}
	}
	return true
}

// runsWithout: the chain's target membership leaves id out, and every
// member confirmed the target epoch (it takes writes again).
func runsWithout(c *streamsv1alpha1.ReplicationChain, id string) bool {
	if len(c.Status.Members) == 0 {
		return false
	}
	for _, m := range c.Status.Members {
		if m.Name == id || m.ConfirmedEpoch != c.Status.TargetEpoch {
			return false
		}
	}
	return true
}

// wholeChains are the namespace's chains that are Ready with their
// replication factor of members, every one in the chain at its epoch.
func wholeChains(g Gomega, ns string) []string {
	var list streamsv1alpha1.ReplicationChainList
	g.Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, c := range list.Items {
		if !meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainReadyCondition) ||
			len(c.Status.Members) != int(c.Spec.ReplicationFactor) {
			continue
		}
		if !slices.ContainsFunc(c.Status.Members, func(m streamsv1alpha1.ChainMember) bool {
			return m.State != streamsv1alpha1.MemberInChain || m.ConfirmedEpoch != c.Status.TargetEpoch
		}) {
			out = append(out, c.Name)
		}
	}
	return out
}

// pct is the q-quantile of ds (0: the least, 1: the greatest), "-" when
// empty.
func pct(ds []time.Duration, q float64) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))].Round(10 * time.Millisecond).String()
}

// selfCPU is the CPU time this process (the operator, and the test's own
// polling) has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	Expect(syscall.Getrusage(syscall.RUSAGE_SELF, &ru)).To(Succeed())
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
