package devcluster

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/go-logr/logr"

	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// The dev master: catena dev plays each local chain's master with the same
// planner the operator uses (replica/chainplan). planRepairs turns the
// replicas' Status reports into the calls to make; master carries them out.

type agreeKey struct {
	partition uint32
	replica   string
}

// repairInput is what planRepairs decides from.
type repairInput struct {
	Stream      string
	Partitions  int
	Replication int
	// Config is the stream's config as this master installs it
	// (chainmaster.StreamConfig: what the heads enforce, the minimum chain
	// length among it); nil: the config of the latest report, as the
	// members run it.
	Config *catenapb.StreamConfig
	// Addrs of every replica this master runs, by id.
	Addrs map[string]string
	// Failed replicas: their process exited and has not come back yet, or
	// they have not answered for the failure timeout.
	Failed map[string]bool
	// Reports are the latest Status answer of each replica (possibly from
	// an earlier round); Answered says which answered this round (the
	// others are in doubt unless Failed).
	Reports  map[string]*catenapb.StatusResponse
	Answered map[string]bool
	// Chains is the master's record of each partition's chain (what it
	// last decided); absent: take the highest epoch any replica reports.
	Chains map[uint32]chainplan.Chain
	// Agreements found by earlier EpochEnd exchanges.
	Agreements map[agreeKey]chainmaster.Agreement
	// LinkTimeoutMs: see chainmaster.Input (the failure timeout; 0: off).
	LinkTimeoutMs uint64
}

// planRepairs returns, for every partition whose chain needs work, the plan
// and the calls to make (replica/master does the planning, as it does for
// the operator). It does no I/O.
func planRepairs(in repairInput) ([]*chainmaster.Repair, error) {
	answered := map[string]bool{}
	for id := range in.Answered {
		answered[id] = in.Answered[id] && in.Reports[id] != nil
	}
	var out []*chainmaster.Repair
	for p := range uint32(in.Partitions) {
		reports := chainmaster.PartitionReports(in.Reports, in.Stream, p)
		latest := chainmaster.LatestReport(reports)
		if latest == nil {
			continue // not configured yet: ensureStream's job
		}
		cfg := in.Config
		if cfg == nil {
			cfg = latest.GetConfig()
		}
		agreements := map[string]chainmaster.Agreement{}
		for k, a := range in.Agreements {
			if k.partition == p {
				agreements[k.replica] = a
			}
		}
		var chain *chainplan.Chain
		if c, ok := in.Chains[p]; ok {
			chain = &c
		}
		r, err := chainmaster.Plan(chainmaster.Input{
			Stream: in.Stream, Partition: p, Config: cfg, Replication: in.Replication, MinLength: int(max(cfg.GetMinChainLength(), 1)),
			Addrs: in.Addrs, Failed: in.Failed, Reports: reports, Answered: answered, Chain: chain, Agreements: agreements,
			LinkTimeoutMs: in.LinkTimeoutMs,
		})
		if err != nil {
			return nil, err
		}
		if r != nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// master is catena dev's chain master, of every chain of every stream it
// hosts.
type master struct {
	streams     []*masterStream
	replication int
	pool        *transport.Pool
	log         logr.Logger
	// obs probes the replicas and decides the failure of those that stop
	// answering, as the operator's observer does (tests that drive the
	// master by hand give it a failure timeout no test reaches: then only
	// exits count).
	obs *chainmaster.Observer
	// joins asks tails to reach the replicas that would join behind them.
	joins chainmaster.JoinCheck

	addrs   map[string]string
	failed  map[string]bool                     // process exited, not restarted and ready yet
	silent  map[string]bool                     // declared failed by the timeout (for logs)
	reports map[string]*catenapb.StatusResponse // last answer of each replica, every stream
}

// newMaster returns a master of streams on the replicas at addrs, which it
// starts probing.
func newMaster(pool *transport.Pool, log logr.Logger, addrs map[string]string, replication int, failureTimeout time.Duration, streams ...*masterStream) *master {
	m := &master{
		streams: streams, replication: replication, pool: pool, log: log,
		addrs: maps.Clone(addrs), failed: map[string]bool{},
		obs: chainmaster.NewObserver(pool, chainmaster.ObserverOptions{
			FailureTimeout: failureTimeout, Interval: probeInterval, CallTimeout: probeTimeout,
		}),
	}
	m.obs.SetReplicas(m.addrs)
	return m
}

// stop ends the master's probes.
func (m *master) stop() { m.obs.Stop() }

// masterStream is what the master keeps of one stream's chains.
type masterStream struct {
	name       string
	partitions int
	// config is what every install carries (nil: the members' own).
	config     *catenapb.StreamConfig
	chains     map[uint32]chainplan.Chain
	agreements map[agreeKey]chainmaster.Agreement
}

func newMasterStream(name string, partitions int, config *catenapb.StreamConfig) *masterStream {
	return &masterStream{name: name, partitions: partitions, config: config, chains: map[uint32]chainplan.Chain{}, agreements: map[agreeKey]chainmaster.Agreement{}}
}

const (
	repairCallTimeout = 5 * time.Second
	repairMaxRounds   = 10
)

// failedNow is every replica the planner must treat as failed: exited, or
// failed by the detector (silent for the failure timeout, or silent while
// a neighbour that answered reports its link to it down). It logs each
// declaration once.
func (m *master) failedNow(snap chainmaster.Snapshot) map[string]bool {
	out := map[string]bool{}
	for id := range m.failed {
		out[id] = m.failed[id]
	}
	if m.silent == nil {
		m.silent = map[string]bool{}
	}
	for id := range m.addrs {
		if m.failed[id] {
			continue
		}
		switch snap.Health[id] {
		case chainplan.Failed:
			out[id] = true
			if !m.silent[id] {
				m.silent[id] = true
				m.log.Info("Replica stopped answering; declaring it failed", "replica", id, "silentFor", snap.SilentFor[id].String(), "failureTimeout", m.obs.Options().FailureTimeout.String(), "neighbourLinkDown", snap.NeighbourDown[id].String())
			}
		case chainplan.Alive:
			if m.silent[id] {
				delete(m.silent, id)
				m.log.Info("Replica answers again; it returns like a restarted one", "replica", id)
			}
		}
	}
	return out
}

// repair plans from a fresh snapshot and carries out plans until no stream
// has work left (or a bounded number of rounds, the next tick resumes).
// Each round waits for the replicas to show what happened before it
// (Observer.Refresh: a probe round trip, at most the freshness window when
// a replica stops answering).
func (m *master) repair(ctx context.Context) {
	for range repairMaxRounds {
		rctx, cancel := context.WithTimeout(ctx, repairCallTimeout)
		snap, current := m.obs.Refresh(rctx)
		cancel()
		if ctx.Err() != nil || !current || !snap.Complete {
			return // the next tick looks again
		}
		m.reports = snap.Reports
		answered := snap.Answered
		failed := m.failedNow(snap)
		worked := false
		for _, s := range m.streams {
			if ctx.Err() != nil {
				return
			}
			if m.repairStream(ctx, s, answered, failed) {
				worked = true
			}
		}
		if !worked {
			return
		}
	}
}

// repairStream plans one stream's chains from the round's reports and
// carries the plans out; it reports whether there was work. A stream that
// cannot be planned is logged and left to the next round, the others go
// on.
func (m *master) repairStream(ctx context.Context, s *masterStream, answered, failed map[string]bool) bool {
	repairs, err := planRepairs(repairInput{
		Stream: s.name, Partitions: s.partitions, Replication: m.replication, Config: s.config,
		Addrs: m.addrs, Failed: failed, Reports: m.reports, Answered: answered, Chains: s.chains, Agreements: s.agreements,
		LinkTimeoutMs: m.linkTimeoutMs(),
	})
	if err != nil {
		m.log.Error(err, "Cannot plan chain repair", "stream", s.name)
		return false
	}
	var waiting []*chainmaster.Repair
	for _, pr := range repairs {
		if pr.Plan.Changed && len(pr.Joins) > 0 {
			// As the operator: a replica joins only once the member it
			// joins behind reaches it.
			if fresh, err := m.joins.Check(ctx, m.executor(), pr); err != nil {
				if fresh {
					m.log.Info("Waiting for a joining replica to be reachable from the chain", "stream", s.name, "partition", pr.Partition,
						"members", pr.Plan.Members, "reason", err.Error())
				}
				waiting = append(waiting, pr)
				continue
			}
		}
		m.log.Info("Reordering chain", "stream", s.name, "partition", pr.Partition, "epoch", pr.Plan.Epoch,
			"reason", pr.Plan.Reason, "from", pr.Chain.Members, "fromEpoch", pr.Chain.Epoch, "members", pr.Plan.Members,
			"writesAllowed", pr.Plan.WritesAllowed, "actions", chainmaster.ActionStrings(pr.Plan.Actions))
		if pr.Plan.Changed {
			// Recorded before it is installed, as the operator writes
			// the ReplicationChain first: a half-installed epoch is
			// finished by the next round (members that have not
			// confirmed it get it again).
			s.chains[pr.Partition] = chainplan.Chain{Epoch: pr.Plan.Epoch, Members: slices.Clone(pr.Plan.Members)}
		} else if _, ok := s.chains[pr.Partition]; !ok {
			s.chains[pr.Partition] = pr.Chain
		}
		if err := m.execute(ctx, s, pr); err != nil {
			m.log.Error(err, "Chain repair step failed; retrying on the next round", "stream", s.name, "partition", pr.Partition)
		}
	}
	for _, pr := range repairs {
		if !slices.Contains(waiting, pr) && !keepsCopying(pr, chainmaster.PartitionReports(m.reports, s.name, pr.Partition)) {
			return true
		}
	}
	return false
}

// keepsCopying reports whether a repair only asks replicas to go on with
// copies they report running from the same source. That is no progress to
// look at again at once: a copy of gigabytes otherwise kept the master
// probing every replica back to back (repairMaxRounds a tick) until it
// ended; the next tick sees how far it got. reports are the replicas'
// reports of the repair's partition.
func keepsCopying(pr *chainmaster.Repair, reports map[string]*catenapb.PartitionStatus) bool {
	if pr.Plan.Changed || len(pr.Calls) == 0 {
		return false
	}
	for _, c := range pr.Calls {
		if c.Kind != chainmaster.CallCatchUp || reports[c.Replica].GetCopy().GetSourceId() != c.CatchUp.GetSourceId() {
			return false
		}
	}
	return true
}

func (m *master) executor() chainmaster.Executor {
	return chainmaster.Executor{Conns: m.pool, Log: m.log, CallTimeout: repairCallTimeout}
}

func (m *master) execute(ctx context.Context, s *masterStream, pr *chainmaster.Repair) error {
	found, err := m.executor().Execute(ctx, s.name, pr)
	for id, a := range found {
		s.agreements[agreeKey{pr.Partition, id}] = a
	}
	return err
}

// linkTimeoutMs is how long a predecessor's report of a silent link makes
// its successor cut off: the failure timeout, as for a silent replica.
func (m *master) linkTimeoutMs() uint64 {
	return uint64(m.obs.Options().FailureTimeout.Milliseconds())
}
