package devcluster

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// The dev master: catena dev plays each local chain's master with the same
// planner the operator uses (replica/chainplan). planRepairs turns the
// replicas' Status reports into the calls to make; master carries them out.

// callKind is an RPC the dev master makes for repair.
type callKind int

const (
	callConfigure callKind = iota + 1
	callEpochEnd
	callTruncate
)

// repairCall is one RPC to one replica.
type repairCall struct {
	Kind    callKind
	Replica string // who receives the call
	Addr    string

	Configure *catenapb.ConfigureRequest
	Truncate  *catenapb.TruncateRequest
	// EpochEnd asks a chain member where Member's last log epoch ended;
	// the answer, capped at Member's log end, is Member's agreement.
	EpochEnd     *catenapb.EpochEndRequest
	Member       string
	MemberAddr   string
	MemberLogEnd uint64
}

// agreement is a returning replica's agreement with a chain, valid while
// the chain epoch and the replica's log are what they were when asked.
type agreement struct {
	chainEpoch, logEnd, lastLogEpoch uint64
	offset                           uint64
}

type agreeKey struct {
	partition uint32
	replica   string
}

// repairInput is what planRepairs decides from.
type repairInput struct {
	Stream      string
	Partitions  int
	Replication int
	MinLength   int
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
	Agreements map[agreeKey]agreement
}

// partitionRepair is the plan for one partition and the calls carrying it
// out, in order.
type partitionRepair struct {
	Partition uint32
	Chain     chainplan.Chain // the chain the plan starts from
	Plan      chainplan.Plan
	Calls     []repairCall
}

// planRepairs returns, for every partition whose chain needs work, the plan
// and the calls to make. It does no I/O.
func planRepairs(in repairInput) ([]partitionRepair, error) {
	ids := make([]string, 0, len(in.Addrs))
	for id := range in.Addrs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	// Each replica's report of each partition of the stream.
	byPart := map[uint32]map[string]*catenapb.PartitionStatus{}
	for id, resp := range in.Reports {
		for _, ps := range resp.GetPartitions() {
			if ps.GetStream() != in.Stream {
				continue
			}
			if byPart[ps.GetPartition()] == nil {
				byPart[ps.GetPartition()] = map[string]*catenapb.PartitionStatus{}
			}
			byPart[ps.GetPartition()][id] = ps
		}
	}
	var out []partitionRepair
	for p := range uint32(in.Partitions) {
		reports := byPart[p]
		// The stream config and, without a record, the chain: from the
		// report of the highest epoch.
		var latest *catenapb.PartitionStatus
		for _, id := range ids {
			if ps := reports[id]; ps != nil && ps.GetEpoch() > 0 && (latest == nil || ps.GetEpoch() > latest.GetEpoch()) {
				latest = ps
			}
		}
		cur, ok := in.Chains[p]
		if !ok {
			if latest == nil {
				continue // not configured yet: ensureStream's job
			}
			cur = chainplan.Chain{Epoch: latest.GetEpoch()}
			for _, m := range latest.GetMembers() {
				cur.Members = append(cur.Members, m.GetId())
			}
		}
		if latest == nil {
			continue // nobody answered with a configuration: nothing to act on
		}
		cfg := latest.GetConfig()
		if in.MinLength > 0 && cfg.GetMinChainLength() != uint32(in.MinLength) {
			// The master's minimum is what the heads enforce.
			cfg = proto.Clone(cfg).(*catenapb.StreamConfig)
			cfg.MinChainLength = uint32(in.MinLength)
		}
		var reps []chainplan.Replica
		for _, id := range ids {
			r := chainplan.Replica{ID: id, Health: chainplan.Unknown}
			ps, answered := reports[id], in.Answered[id] && in.Reports[id] != nil
			switch {
			case in.Failed[id]:
				r.Health = chainplan.Failed
			case answered && ps == nil:
				r.Health, r.Log = chainplan.Alive, chainplan.LogEmpty
			case answered:
				r.Health = chainplan.Alive
			}
			if ps != nil {
				r.Epoch, r.LogEnd, r.DurableEnd, r.Committed, r.LastLogEpoch = ps.GetEpoch(), ps.GetLogEnd(), ps.GetDurable(), ps.GetCommitted(), ps.GetLastLogEpoch()
				switch {
				case ps.GetError() != "":
					r.Log = chainplan.LogCorrupt
				case ps.GetLogEnd() == 0:
					r.Log = chainplan.LogEmpty
				}
				if a, ok := in.Agreements[agreeKey{p, id}]; ok && a.chainEpoch == cur.Epoch && a.logEnd == r.LogEnd && a.lastLogEpoch == r.LastLogEpoch {
					r.Agreement = &a.offset
				}
			}
			reps = append(reps, r)
		}
		plan, err := chainplan.Next(chainplan.Input{Chain: cur, Replicas: reps, ReplicationFactor: in.Replication, MinLength: in.MinLength})
		if err != nil {
			return nil, fmt.Errorf("partition %s/%d: %w", in.Stream, p, err)
		}
		if !plan.Changed && len(plan.Actions) == 0 {
			continue
		}
		configure := func(epoch uint64, members []string) *catenapb.ConfigureRequest {
			req := &catenapb.ConfigureRequest{Stream: in.Stream, Partition: p, Epoch: epoch, Config: cfg}
			for _, m := range members {
				req.Members = append(req.Members, &catenapb.Member{Id: m, Addr: in.Addrs[m]})
			}
			return req
		}
		call := func(kind callKind, to string) repairCall {
			return repairCall{Kind: kind, Replica: to, Addr: in.Addrs[to]}
		}
		pr := partitionRepair{Partition: p, Chain: cur, Plan: plan}
		for _, a := range plan.Actions {
			switch a.Kind {
			case chainplan.ActionConfigure:
				c := call(callConfigure, a.Member)
				c.Configure = configure(cur.Epoch, cur.Members)
				pr.Calls = append(pr.Calls, c)
			case chainplan.ActionFindDivergence:
				// Tell the returning replica the current chain first: it
				// stops believing in the membership it left (it has no role
				// in this one), which Truncate requires.
				c := call(callConfigure, a.Member)
				c.Configure = configure(cur.Epoch, cur.Members)
				pr.Calls = append(pr.Calls, c)
				c = call(callEpochEnd, a.From)
				c.EpochEnd = &catenapb.EpochEndRequest{Stream: in.Stream, Partition: p, Epoch: a.Epoch}
				c.Member, c.MemberAddr = a.Member, in.Addrs[a.Member]
				if ps := reports[a.Member]; ps != nil {
					c.MemberLogEnd = ps.GetLogEnd()
				}
				pr.Calls = append(pr.Calls, c)
			case chainplan.ActionTruncate:
				c := call(callConfigure, a.Member)
				c.Configure = configure(cur.Epoch, cur.Members)
				pr.Calls = append(pr.Calls, c)
				c = call(callTruncate, a.Member)
				c.Truncate = &catenapb.TruncateRequest{Stream: in.Stream, Partition: p, To: a.To}
				pr.Calls = append(pr.Calls, c)
			case chainplan.ActionCatchUp, chainplan.ActionJoinAtTail:
				// The joiner catches up as the new tail through the link.
			}
		}
		if plan.Changed {
			// Tail first: by the time a predecessor links, its successor
			// already knows the epoch. A member in doubt (it did not answer
			// this round: paused, partitioned) is not called, so it cannot
			// hold the master up; when it answers again it has not
			// confirmed the epoch and gets it then (ActionConfigure).
			req := configure(plan.Epoch, plan.Members)
			for i := len(plan.Members) - 1; i >= 0; i-- {
				if in.Failed[plan.Members[i]] || !in.Answered[plan.Members[i]] {
					continue
				}
				c := call(callConfigure, plan.Members[i])
				c.Configure = req
				pr.Calls = append(pr.Calls, c)
			}
		}
		out = append(out, pr)
	}
	return out, nil
}

// master is catena dev's chain master.
type master struct {
	stream      string
	partitions  int
	replication int
	minLength   int // fewest members that take writes (0: 1)
	pool        *transport.Pool
	log         logr.Logger
	// health decides failure of replicas that stop answering (nil: only
	// exits count, as in tests that drive the master by hand); now is its
	// clock (nil: time.Now).
	health *healthTracker
	now    func() time.Time

	addrs      map[string]string
	failed     map[string]bool                     // process exited, not restarted and ready yet
	silent     map[string]bool                     // declared failed by the timeout (for logs)
	reports    map[string]*catenapb.StatusResponse // last answer of each replica
	chains     map[uint32]chainplan.Chain
	agreements map[agreeKey]agreement
}

const (
	repairCallTimeout = 5 * time.Second
	repairMaxRounds   = 10
)

func (m *master) clock() time.Time {
	if m.now != nil {
		return m.now()
	}
	return time.Now()
}

// failedNow is every replica the planner must treat as failed: exited, or
// silent for the failure timeout. It logs each declaration once.
func (m *master) failedNow() map[string]bool {
	out := map[string]bool{}
	for id := range m.failed {
		out[id] = m.failed[id]
	}
	if m.health == nil {
		return out
	}
	if m.silent == nil {
		m.silent = map[string]bool{}
	}
	now := m.clock()
	for id := range m.addrs {
		if m.failed[id] {
			continue
		}
		switch m.health.health(id, now) {
		case chainplan.Failed:
			out[id] = true
			if !m.silent[id] {
				m.silent[id] = true
				m.log.Info("Replica stopped answering; declaring it failed", "replica", id, "silentFor", m.health.silentFor(id, now).String(), "failureTimeout", m.health.timeout.String())
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

// repair gathers reports and carries out plans until none has work left
// (or a bounded number of rounds, the next tick resumes).
func (m *master) repair(ctx context.Context) {
	for range repairMaxRounds {
		if ctx.Err() != nil {
			return
		}
		answered := m.gather(ctx)
		repairs, err := planRepairs(repairInput{
			Stream: m.stream, Partitions: m.partitions, Replication: m.replication, MinLength: max(m.minLength, 1),
			Addrs: m.addrs, Failed: m.failedNow(), Reports: m.reports, Answered: answered, Chains: m.chains, Agreements: m.agreements,
		})
		if err != nil {
			m.log.Error(err, "Cannot plan chain repair")
			return
		}
		if len(repairs) == 0 {
			return
		}
		for _, pr := range repairs {
			m.log.Info("Reordering chain", "stream", m.stream, "partition", pr.Partition, "epoch", pr.Plan.Epoch,
				"reason", pr.Plan.Reason, "from", pr.Chain.Members, "fromEpoch", pr.Chain.Epoch, "members", pr.Plan.Members,
				"writesAllowed", pr.Plan.WritesAllowed, "actions", actionStrings(pr.Plan.Actions))
			if pr.Plan.Changed {
				// Recorded before it is installed, as the operator writes
				// the ReplicationChain first: a half-installed epoch is
				// finished by the next round (members that have not
				// confirmed it get it again).
				m.chains[pr.Partition] = chainplan.Chain{Epoch: pr.Plan.Epoch, Members: slices.Clone(pr.Plan.Members)}
			} else if _, ok := m.chains[pr.Partition]; !ok {
				m.chains[pr.Partition] = pr.Chain
			}
			if err := m.execute(ctx, pr); err != nil {
				m.log.Error(err, "Chain repair step failed; retrying on the next round", "stream", m.stream, "partition", pr.Partition)
			}
		}
	}
}

func actionStrings(as []chainplan.Action) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

// gather asks every replica whose process runs for its status, all at
// once and each on a short deadline (a paused one must not hold the others
// up), keeps the answers in m.reports, feeds the outcomes to the failure
// detector and returns who answered. A replica that does not answer keeps
// its last report: it is in doubt, and what it last said (e.g. how much of
// the log it holds) is still the best knowledge of it.
func (m *master) gather(ctx context.Context) map[string]bool {
	if m.reports == nil {
		m.reports = map[string]*catenapb.StatusResponse{}
	}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = map[string]bool{}
	)
	for id, addr := range m.addrs {
		if m.failed[id] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := m.pool.Get(addr)
			if err != nil {
				return
			}
			cctx, cancel := context.WithTimeout(ctx, probeTimeout)
			resp, err := catenapb.NewReplicaClient(conn).Status(cctx, &catenapb.StatusRequest{Stream: m.stream})
			cancel()
			if err == nil {
				mu.Lock()
				m.reports[id] = resp
				out[id] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if m.health != nil && ctx.Err() == nil {
		now := m.clock()
		for id := range m.addrs {
			if !m.failed[id] {
				m.health.observe(id, now, out[id])
			}
		}
	}
	return out
}

func (m *master) execute(ctx context.Context, pr partitionRepair) error {
	for _, c := range pr.Calls {
		conn, err := m.pool.Get(c.Addr)
		if err != nil {
			return err
		}
		rc := catenapb.NewReplicaClient(conn)
		cctx, cancel := context.WithTimeout(ctx, repairCallTimeout)
		switch c.Kind {
		case callConfigure:
			_, err = rc.Configure(cctx, c.Configure)
			if err != nil {
				err = fmt.Errorf("configure %s at epoch %d: %w", c.Replica, c.Configure.GetEpoch(), err)
			}
		case callTruncate:
			var ps *catenapb.PartitionStatus
			ps, err = rc.Truncate(cctx, c.Truncate)
			if err != nil {
				err = fmt.Errorf("truncate %s to %d: %w", c.Replica, c.Truncate.GetTo(), err)
			} else {
				m.log.Info("Truncated returning replica", "stream", m.stream, "partition", pr.Partition, "replica", c.Replica, "logEnd", ps.GetLogEnd())
			}
		case callEpochEnd:
			err = m.findAgreement(cctx, pr, c, rc)
		}
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// findAgreement asks a chain member where the returning replica's last log
// epoch ended and records the offset below which the returning replica's
// log agrees with the chain (Kafka's leader-epoch rule: if the chain holds
// no batch of that epoch, the answer names the largest epoch it holds
// below it, and the returning replica's own end of that epoch bounds the
// agreement too).
func (m *master) findAgreement(ctx context.Context, pr partitionRepair, c repairCall, rc catenapb.ReplicaClient) error {
	resp, err := rc.EpochEnd(ctx, c.EpochEnd)
	if err != nil {
		return fmt.Errorf("ask %s where epoch %d ended: %w", c.Replica, c.EpochEnd.GetEpoch(), err)
	}
	off := min(resp.GetEndOffset(), c.MemberLogEnd)
	if resp.GetEpoch() < c.EpochEnd.GetEpoch() {
		conn, err := m.pool.Get(c.MemberAddr)
		if err != nil {
			return err
		}
		own, err := catenapb.NewReplicaClient(conn).EpochEnd(ctx, &catenapb.EpochEndRequest{Stream: m.stream, Partition: pr.Partition, Epoch: resp.GetEpoch()})
		if err != nil {
			return fmt.Errorf("ask %s where its epoch %d ended: %w", c.Member, resp.GetEpoch(), err)
		}
		off = min(off, own.GetEndOffset())
	}
	m.agreements[agreeKey{pr.Partition, c.Member}] = agreement{chainEpoch: pr.Chain.Epoch, logEnd: c.MemberLogEnd, lastLogEpoch: c.EpochEnd.GetEpoch(), offset: off}
	m.log.Info("Found where a returning replica agrees with the chain", "stream", m.stream, "partition", pr.Partition,
		"replica", c.Member, "lastLogEpoch", c.EpochEnd.GetEpoch(), "asked", c.Replica, "agreesBelow", off, "logEnd", c.MemberLogEnd)
	return nil
}
